"""A three-node Ray cluster on this machine and a diffserve engine across it: the driver
behind tests/executor/test_ray_cluster.py, run in a process of its own (a fresh Ray,
whatever the test's process has).

    python tests/ray_cluster_driver.py MODEL_DIR RESULT_JSON

Three nodes (``ray.cluster_utils.Cluster``: separate raylets, each with 4 logical CPUs
and a resource naming it), every one on 127.0.0.1. An engine joins through
``ray_address`` (the head's GCS address) with two replicas of a two-rank Ulysses group:
four bundles, so both replicas would fit on one node and where they land is the
placement policy's doing. It records every rank's node (asked inside the actor), the
placement groups and the nodes' resources, serves, asks for three more groups at one
instant through the executor's placement policy, then removes the node of one replica
while both run a long request and records what the engine does next. The facts go to
RESULT_JSON as they are found (a failure keeps the ones before it); the test asserts on
them. The cluster is always shut down; the test also kills this process's session on a
timeout.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
NODE_CPUS = 4  # logical: both 2-rank replicas (4 bundles) fit on any one node
PER_REQUEST = dict(
    prompt="a fox", height=64, width=64, guidance_scale=0.0, max_sequence_length=64
)
# a request still running when the node goes (~0.1 s after its first step; ~1.5 s in all
# here)
LONG_STEPS = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def rank_facts(worker: Any) -> dict[str, Any]:
    """Run inside each rank's actor (collective_rpc): where it runs, as Ray and torch
    see it."""
    import ray

    return {
        "replica": worker.replica,
        "rank": worker.rank,
        "pid": os.getpid(),
        "node": ray.get_runtime_context().get_node_id(),
        "init_method": worker.init_method,
        "node_ip": ray.util.get_node_ip_address(),
    }


def main(model_dir: str, result_path: str) -> int:
    import ray
    from ray.cluster_utils import Cluster

    save = Record(result_path)
    # The head's HTTP ports are free ones, not Ray's fixed defaults (8265, 52365)
    # another Ray here may hold.
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": NODE_CPUS,
            "resources": {"test_node_0": 1},
            "node_ip_address": LOOPBACK,
            "include_dashboard": False,
            "dashboard_port": free_port(),
            "dashboard_agent_listen_port": free_port(),
        },
    )
    try:
        workers = [
            cluster.add_node(
                num_cpus=NODE_CPUS,
                resources={f"test_node_{i}": 1},
                node_ip_address=LOOPBACK,
            )
            for i in (1, 2)
        ]
        cluster.wait_for_nodes(timeout=60)
        save(
            "cluster",
            {
                "address": cluster.address,
                "head": cluster.head_node.node_id,
                "workers": [node.node_id for node in workers],
            },
        )
        run_engine(cluster, model_dir, save)
        save("ok", True)
        return 0
    except BaseException:
        save("error", traceback.format_exc())
        return 1
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def run_engine(cluster: Any, model_dir: str, save: Record) -> None:
    import ray

    from diffserve import Engine, GenerationRequest
    from diffserve.errors import EngineDeadError

    # One batch per replica (max_batch_size 1), and long requests allowed (the node goes
    # while they run).
    engine = Engine(
        model_dir,
        {"server": {"max_steps": LONG_STEPS}},
        distributed_executor_backend="ray",
        ray_address=cluster.address,
        num_replicas=2,
        ulysses_degree=2,
        max_batch_size=1,
        dtype="float32",
        enforce_eager=True,
        env={},
    )
    try:
        save("gcs", ray.get_runtime_context().gcs_address)
        save(
            "nodes",
            [
                {
                    "id": n["NodeID"],
                    "address": n["NodeManagerAddress"],
                    "alive": n["Alive"],
                    "resources": {
                        k: v
                        for k, v in n["Resources"].items()
                        if k in ("CPU", "GPU") or k.startswith("test_node_")
                    },
                }
                for n in ray.nodes()
            ],
        )
        save(
            "groups",
            [
                {
                    "name": g["name"],
                    "strategy": g["strategy"],
                    "state": g["state"],
                    "nodes": sorted(set(g["bundles_to_node_id"].values())),
                }
                for g in ray.util.placement_group_table().values()
                if g["name"].startswith("diffserve-")
            ],
        )
        save("ranks", engine.collective_rpc(rank_facts, timeout=60))
        served = serve_concurrently(
            engine, GenerationRequest, seeds=[1, 2, 3, 4], steps=2
        )
        save(
            "served",
            [
                {"replica": out.attestation["replica"], "node": out.attestation["node"]}
                for out in served
            ],
        )
        save("concurrent_groups", place_concurrently(3))

        # Both replicas run a long request; then one replica's node goes (not the head:
        # the GCS lives there).
        replica_node = {r["replica"]: r["node"] for r in save.facts["ranks"]}
        victim = next(
            node
            for node in cluster.worker_nodes
            if node.node_id in replica_node.values()
        )
        results: dict[int, Any] = {}
        finished: dict[int, float] = {}
        started = [threading.Event(), threading.Event()]

        def long_request(i: int) -> None:
            request = GenerationRequest(
                **PER_REQUEST, num_inference_steps=LONG_STEPS, seed=100 + i
            )
            try:
                results[i] = engine.generate(
                    request, timeout=120, on_progress=lambda _e: started[i].set()
                )
            except Exception as exc:  # noqa: BLE001 - recorded: the lost replica's request must fail
                results[i] = exc
                started[i].set()
            finished[i] = time.monotonic()

        threads = [
            threading.Thread(target=long_request, args=(i,), daemon=True)
            for i in (0, 1)
        ]
        for thread in threads:
            thread.start()
        assert all(event.wait(120) for event in started), (
            "the long requests never started"
        )
        removed_at = time.monotonic()
        cluster.remove_node(victim)
        removal_s = time.monotonic() - removed_at
        for thread in threads:
            thread.join(150)
        outcomes = []
        for i in (0, 1):
            value = results.get(i)
            if isinstance(value, BaseException):
                outcomes.append(
                    {
                        "error": type(value).__name__,
                        "message": str(value)[:400],
                        "dead_error": isinstance(value, EngineDeadError),
                    }
                )
            elif value is not None:
                outcomes.append(
                    {
                        "replica": value.attestation["replica"],
                        "node": value.attestation["node"],
                        "finished_s": round(finished[i] - removed_at, 2),
                    }
                )
            else:
                outcomes.append({"hung": True})
        save(
            "removal",
            {
                "node": victim.node_id,
                "remove_node_s": round(removal_s, 2),
                "done_s": round(time.monotonic() - removed_at, 2),
                "long_requests": outcomes,
            },
        )
        save(
            "health_after",
            {
                "replicas_live": engine.replicas_live,
                "num_replicas": engine.num_replicas,
                "is_dead": engine.is_dead,
                "is_ready": engine.is_ready,
                "stages": engine.stage_health,
                "check_health": check_health(engine),
            },
        )
        after = serve_concurrently(engine, GenerationRequest, seeds=[5, 6, 7], steps=2)
        save(
            "served_after",
            [
                {"replica": out.attestation["replica"], "node": out.attestation["node"]}
                for out in after
            ],
        )
    finally:
        shutdown_start = time.monotonic()
        engine.shutdown()
        save("shutdown_s", round(time.monotonic() - shutdown_start, 2))


def place_concurrently(count: int) -> list[dict[str, Any]]:
    """``count`` more 2-bundle groups asked for at one instant from as many threads (as
    replicas are built), through the executor's placement policy, beside the engine's
    two; each one's nodes, then they are removed."""
    import ray
    from ray.util.placement_group import remove_placement_group

    from diffserve.executor.ray_placement import GROUP_PREFIX, place_replica

    made: list[Any] = [None] * count
    barrier = threading.Barrier(count)

    def make(i: int) -> None:
        barrier.wait()
        made[i] = place_replica({"CPU": 1}, 2, f"{GROUP_PREFIX}test-concurrent-{i}", 60)

    threads = [
        threading.Thread(target=make, args=(i,), daemon=True) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    found = []
    for group, placed in made:
        entry = ray.util.placement_group_table(group)
        found.append(
            {
                "placed": placed,
                "strategy": entry["strategy"],
                "nodes": sorted(set(entry["bundles_to_node_id"].values())),
            }
        )
        remove_placement_group(group)
    return found


class Record:
    """``record(key, value)``: one fact, written to the result file at once with the
    seconds since the start."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.facts: dict[str, Any] = {"timings": {}}
        self.start = time.monotonic()

    def __call__(self, key: str, value: Any) -> None:
        self.facts[key] = value
        self.facts["timings"][key] = round(time.monotonic() - self.start, 2)
        self.path.write_text(json.dumps(self.facts, indent=1))


def serve_concurrently(
    engine: Any, request_cls: Any, seeds: list[int], steps: int
) -> list[Any]:
    """One request per seed, all at once from threads (so every live replica takes
    some)."""
    outputs: dict[int, Any] = {}

    def one(seed: int) -> None:
        try:
            outputs[seed] = engine.generate(
                request_cls(**PER_REQUEST, num_inference_steps=steps, seed=seed),
                timeout=120,
            )
        except Exception as exc:  # noqa: BLE001 - raised below, on the driver's thread
            outputs[seed] = exc

    threads = [
        threading.Thread(target=one, args=(seed,), daemon=True) for seed in seeds
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    for seed in seeds:
        if isinstance(outputs.get(seed), BaseException) or seed not in outputs:
            raise RuntimeError(f"request seed {seed} failed: {outputs.get(seed)!r}")
    return [outputs[seed] for seed in seeds]


def check_health(engine: Any) -> str:
    try:
        engine.check_health()
    except Exception as exc:  # noqa: BLE001 - reported, the test asserts there is none
        return f"{type(exc).__name__}: {exc}"
    return "ok"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
