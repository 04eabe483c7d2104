"""Data-parallel replicas (``num_replicas: 2``) on every executor: the work is shared
and every image is bit-identical to a one-replica run; a replica whose worker dies or
hangs is taken out while the other keeps serving; the last one going kills the engine;
/health and /metrics show the degraded state, and /metrics the load per model and
replica a router reads."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from background import generate_in_background, wait_until
from e2e_utils import pid_alive
from procs import worker_children
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess

from diffserve import Engine, GenerationRequest
from diffserve.errors import EngineDeadError
from diffserve.worker.extension import WorkerExtension

pytestmark = pytest.mark.e2e

# Replicas are the engine's (engine/replicas.py) whatever the executor: uni and mp here;
# two replicas on Ray serve Wan videos in
# tests/e2e/test_wan_parallel.py::test_ray_replicas_share_the_videos (one Ray engine
# start saved).
EXECUTORS = ["uni", "mp"]

# Released at teardown: a uni worker thread hung in a step cannot be killed.
RELEASE = threading.Event()


class SlowStepExtension(WorkerExtension):
    """Every transformer forward sleeps 50 ms first, so a long request is still running
    when killed."""

    def after_load(self, worker: Any) -> None:
        transformer = worker.pipeline.transformer
        original = transformer.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            time.sleep(0.05)
            return original(*args, **kwargs)

        transformer.forward = forward


class HangReplicaOneExtension(WorkerExtension):
    """Replica 1's transformer forward blocks until RELEASE is set; replica 0 is
    healthy."""

    def after_load(self, worker: Any) -> None:
        if worker.replica != 1:
            return
        transformer = worker.pipeline.transformer

        def forward(*args: Any, **kwargs: Any) -> Any:
            RELEASE.wait()
            raise RuntimeError("released from the injected hang")

        transformer.forward = forward


def make_request(seed: int, steps: int = 4) -> GenerationRequest:
    return GenerationRequest(
        prompt="a fox",
        height=128,
        width=128,
        num_inference_steps=steps,
        seed=seed,
        guidance_scale=0.0,
        max_sequence_length=64,
    )


def deploy(
    executor: str, replicas: int, extension: type | None = None, **extra: Any
) -> dict[str, Any]:
    config = {
        "dtype": "float32",
        "enforce_eager": True,
        "distributed_executor_backend": executor,
        "num_replicas": replicas,
        **extra,
    }
    if extension is not None:
        config["worker_extension_cls"] = (
            f"{extension.__module__}.{extension.__qualname__}"
        )
    return config


def in_thread(
    engine: Engine, req: GenerationRequest, started: threading.Event | None = None
) -> tuple[threading.Thread, dict[str, Any]]:
    return generate_in_background(engine, req, timeout=120, started=started)


SEEDS = list(range(200, 208))


@pytest.fixture(scope="module")
def one_replica_images(tiny_flux_dir: Path) -> dict[int, bytes]:
    """Each seed's image from a one-replica uni engine: every executor gives these bytes
    (tests/e2e/test_backend_runtime.py::test_same_seed_same_bytes_on_every_executor)."""
    with Engine(str(tiny_flux_dir), deploy_config=deploy("uni", 1), env={}) as single:
        return {
            seed: single.generate(make_request(seed)).images[0].tobytes()
            for seed in SEEDS
        }


@pytest.mark.parametrize("executor", EXECUTORS)
def test_two_replicas_share_the_work_bit_identically(
    executor: str, tiny_flux_dir: Path, one_replica_images: dict[int, bytes]
) -> None:
    seeds, reference = SEEDS, one_replica_images
    with Engine(
        str(tiny_flux_dir),
        deploy_config=deploy(
            executor, 2, max_batch_size=2, warmup={"enabled": True, "steps": 1}
        ),
        env={},
    ) as engine:
        assert (
            engine.num_replicas == 2 and engine.replicas_live == 2 and engine.is_ready
        )
        assert len(engine.worker_pids) == 2
        # Warmup ran once per replica, and RPCs reach every rank of every replica,
        # replica-major.
        described = engine.collective_rpc("describe")
        assert [d["replica"] for d in described] == [0, 1]
        assert [d["batches_run"] for d in described] == [1, 1]
        outs: dict[int, Any] = {}
        threads = [
            threading.Thread(
                target=lambda s=s: outs.__setitem__(s, engine.generate(make_request(s)))
            )
            for s in seeds
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert sorted(outs) == seeds
        assert {out.attestation["replica"] for out in outs.values()} == {0, 1}
        # Max_batch_size per batch.
        assert all(out.attestation["batch_size"] <= 2 for out in outs.values())
        for seed, out in outs.items():
            assert out.seeds == [seed] and out.images[0].tobytes() == reference[seed], (
                seed
            )
        assert engine.stats()["requests_ok"] == 8
        pids = list(engine.worker_pids)
    assert not engine.is_ready and engine.replicas_live == 0
    if executor != "uni":
        assert not any(pid_alive(p) for p in pids)


# mp only: taking a replica out is the engine's (engine/replicas.py), whatever executor
# lost its worker; a Ray actor's death reaching the engine is tests/e2e/test_ray.py's
# and test_parallel_cfg.py's (~30 s of Ray saved).
@pytest.mark.parametrize("executor", ["mp"])
def test_killed_replica_is_taken_out_and_the_last_one_kills_the_engine(
    executor: str, tiny_flux_dir: Path
) -> None:
    engine = Engine(
        str(tiny_flux_dir), deploy_config=deploy(executor, 2, SlowStepExtension), env={}
    )
    pids = list(engine.worker_pids)
    try:
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        # Two long requests with different batch keys: running at the same time, they
        # run on both.
        started = [threading.Event(), threading.Event()]
        long_runs = [
            in_thread(engine, make_request(1, steps=60), started[0]),
            in_thread(engine, make_request(2, steps=59), started[1]),
        ]
        assert all(event.wait(60) for event in started)
        killed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        for thread, _ in long_runs:
            thread.join(30)
        boxes = [box for _, box in long_runs]
        errors = [box["error"] for box in boxes if "error" in box]
        # The killed replica's request fails with the documented error, at once; the
        # other finishes.
        assert len(errors) == 1, boxes
        assert isinstance(errors[0], EngineDeadError) and "replica 1 of 2" in str(
            errors[0]
        )
        assert "retry" in str(errors[0])
        failed = next(box for box in boxes if "error" in box)
        assert failed["done_at"] - killed_at < 10
        survivor = next(box["out"] for box in boxes if "out" in box)
        assert survivor.attestation["replica"] == 0
        # Degraded, not dead: later requests run on replica 0, RPCs reach the live
        # replica only.
        assert not engine.is_dead and engine.is_ready and engine.replicas_live == 1
        engine.check_health()
        later = [engine.generate(make_request(seed), timeout=60) for seed in (3, 4, 5)]
        assert [out.attestation["replica"] for out in later] == [0, 0, 0]
        assert engine.collective_rpc("ping", timeout=30) == ["pong"]
        # The last replica going kills the engine: the in-flight request and later ones
        # get EngineDeadError.
        event = threading.Event()
        thread, box = in_thread(engine, make_request(6, steps=60), event)
        assert event.wait(60)
        killed_at = time.monotonic()
        os.kill(pids[0], signal.SIGKILL)
        thread.join(10)
        assert isinstance(box.get("error"), EngineDeadError), box
        assert box["done_at"] - killed_at < 10
        assert engine.is_dead and engine.replicas_live == 0
        with pytest.raises(EngineDeadError):
            engine.generate(make_request(7))
    finally:
        start = time.monotonic()
        engine.shutdown()
        assert time.monotonic() - start < 15
    assert not any(pid_alive(p) for p in pids)
    assert not set(pids) & {p.pid for p in multiprocessing.active_children()}


def test_hung_replica_is_taken_out_while_the_other_serves(tiny_flux_dir: Path) -> None:
    engine = Engine(
        str(tiny_flux_dir),
        deploy_config=deploy(
            "uni",
            2,
            HangReplicaOneExtension,
            max_batch_size=1,
            warmup={"enabled": False},
            server={"batch_deadline_floor_s": 6, "batch_deadline_s_per_mpix_step": 0},
        ),
        env={},
    )
    try:
        runs = [in_thread(engine, make_request(seed)) for seed in range(10, 14)]
        # Replica 1 picks up a request and hangs: past its 6 s deadline it is taken out,
        # not the engine. (Not 2 s: replica 0's first, unwarmed batch took over 2 s on
        # two cores busy with three test workers, and was taken out as hung too.)
        assert wait_until(lambda: engine.replicas_live == 1, 20)
        for thread, _ in runs:
            thread.join(30)
        boxes = [box for _, box in runs]
        errors = [box["error"] for box in boxes if "error" in box]
        assert len(errors) == 1, boxes
        assert isinstance(errors[0], EngineDeadError) and "deadline" in str(errors[0])
        assert "replica 1" in str(errors[0])
        assert all(
            box["out"].attestation["replica"] == 0 for box in boxes if "out" in box
        )
        assert not engine.is_dead and engine.loop_state != "dead"
        assert engine.generate(make_request(20), timeout=30).attestation["replica"] == 0
        time.sleep(1.0)
        assert engine.heartbeat_age_s < 1.0  # the live replica's loop keeps beating
    finally:
        start = time.monotonic()
        engine.shutdown()
        assert time.monotonic() - start < 10
        RELEASE.set()


def _gauge(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    match = re.search(r"^diffserve_replicas_live ([0-9.]+)$", text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


MODEL = "tiny-flux"
STEPS, SIZE = 30, 128  # long enough (~1 s a request on 2 cores) to be seen running
WORK = STEPS * SIZE * SIZE / 1e6  # one request's steps x megapixels


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def documented_router_metrics() -> set[str]:
    """The metric names of docs/deploy.md's router table."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    table = text.split("## Metrics for routers and autoscalers", 1)[1].split("\n\n", 3)[
        2
    ]
    names = set(re.findall(r"`(diffserve_[a-z_]+)`", table))
    assert len(names) >= 9, table
    return names


def model_value(samples: dict, name: str) -> float:
    return samples[(f"diffserve_model_{name}", (("model", MODEL),))]


def replica_values(samples: dict, name: str) -> dict[str, float]:
    return {
        dict(labels)["replica"]: v
        for (metric, labels), v in samples.items()
        if metric == f"diffserve_replica_{name}" and dict(labels).get("model") == MODEL
    }


@pytest.fixture(scope="module")
def two_replica_server(
    tiny_flux_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Any:
    """An mp server of two replicas (one batch at a time each); the degraded-health
    test, the last to use it, kills its workers."""
    path = tmp_path_factory.mktemp("two-replicas") / "deploy.yaml"
    path.write_text(
        "distributed_executor_backend: mp\nnum_replicas: 2\nmax_batch_size: "
        "1\nenforce_eager: true\n"
        "dtype: float32\n"
    )
    server = ServerProcess(
        [
            str(tiny_flux_dir),
            "--deploy-config",
            str(path),
            "--served-model-name",
            MODEL,
        ],
        path.parent / "server.log",
    )
    try:
        server.wait_for("/ready")
        yield server
    finally:
        server.stop()


def test_router_metrics_queue_in_flight_and_outstanding_work_per_model_and_replica(
    two_replica_server: Any,
) -> None:
    # The signals a router or an autoscaler reads from /metrics
    # (docs/deploy.md#metrics-for-routers-and-autoscalers) while three requests run on
    # two replicas.
    server = two_replica_server
    idle = scrape(server.url)
    assert documented_router_metrics() <= {name for name, _ in idle}, (
        "a documented router metric is missing"
    )
    assert replica_values(idle, "live") == {"0": 1.0, "1": 1.0}
    for name in (
        "requests_running",
        "requests_in_flight",
        "outstanding_work",
        "queue_depth",
    ):
        assert model_value(idle, name) == 0.0, name

    statuses: list[int] = []
    body = {
        "prompt": "a fox",
        "size": f"{SIZE}x{SIZE}",
        "num_inference_steps": STEPS,
        "model": MODEL,
    }

    def post(seed: int) -> None:
        reply = httpx.post(
            server.url + "/v1/images/generations",
            json={**body, "seed": seed},
            timeout=120,
        )
        statuses.append(reply.status_code)

    threads = [threading.Thread(target=post, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    samples, busiest = [], None
    while any(t.is_alive() for t in threads):
        sample = scrape(server.url)
        samples.append(sample)
        if (
            model_value(sample, "requests_running") == 2
            and model_value(sample, "queue_depth") == 1
        ):
            busiest = busiest or sample
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    assert statuses == [200, 200, 200]

    for sample in samples:  # every scrape is consistent with itself
        running, queued = (
            model_value(sample, "requests_running"),
            model_value(sample, "queue_depth"),
        )
        assert model_value(sample, "requests_in_flight") == running + queued
        assert sum(replica_values(sample, "requests_running").values()) == running
        per_replica_work = sum(replica_values(sample, "outstanding_work").values())
        # the waiting requests' work is the model's, not a replica's; no scrape sees
        # more than was asked
        assert model_value(sample, "outstanding_work") == pytest.approx(
            per_replica_work + queued * WORK, rel=1e-4
        )
        assert model_value(sample, "outstanding_work") <= 3 * WORK + 1e-6
    # Three requests on two replicas: once two ran and one waited, each replica ran one,
    # the waiting one counted whole and the running ones less than whole (steps done
    # count off).
    assert busiest is not None, (
        f"never saw 2 running + 1 waiting in {len(samples)} scrapes"
    )
    assert replica_values(busiest, "requests_running") == {"0": 1.0, "1": 1.0}
    assert WORK < model_value(busiest, "outstanding_work") <= 3 * WORK
    works = [
        model_value(s, "outstanding_work")
        for s in samples
        if model_value(s, "requests_in_flight") > 0
    ]
    assert min(works) < WORK, "the running requests' finished steps never counted off"

    done = scrape(server.url)
    for name in (
        "requests_running",
        "requests_in_flight",
        "outstanding_work",
        "queue_depth",
    ):
        assert model_value(done, name) == 0.0, name
    assert replica_values(done, "outstanding_work") == {"0": 0.0, "1": 0.0}


def test_http_health_reports_degraded_replicas(two_replica_server: Any) -> None:
    server = two_replica_server
    workers: list[int] = []
    body = {"prompt": "a fox", "size": "64x64", "num_inference_steps": 2}
    try:
        assert httpx.get(server.url + "/health").json() == {
            "status": "ok",
            "replicas_live": 2,
            "replicas": 2,
        }
        assert _gauge(server.url) == 2.0
        workers = worker_children(server.proc.pid)
        assert len(workers) == 2, workers
        os.kill(workers[0], signal.SIGKILL)
        assert wait_until(
            lambda: (
                httpx.get(server.url + "/health", timeout=5).json().get("status")
                == "degraded"
            ),
            10,
        ), server.log()
        health = httpx.get(server.url + "/health", timeout=5)
        assert health.status_code == 200 and health.json() == {
            "status": "degraded",
            "replicas_live": 1,
            "replicas": 2,
        }
        assert httpx.get(server.url + "/ready", timeout=5).status_code == 200
        assert _gauge(server.url) == 1.0
        assert (
            httpx.post(
                server.url + "/v1/images/generations", json=body, timeout=60
            ).status_code
            == 200
        )
        os.kill(workers[1], signal.SIGKILL)
        assert wait_until(
            lambda: httpx.get(server.url + "/health", timeout=5).status_code == 503, 10
        )
        assert httpx.get(server.url + "/ready", timeout=5).status_code == 503
        assert _gauge(server.url) == 0.0
    finally:
        for pid in workers:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
