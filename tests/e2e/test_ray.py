"""The ray executor end to end: a real Engine on Ray actors in the session's local Ray
(one node, CPU).

Serving and attestation (executor, worker PID, Ray node), bit-identity with uni, an
actor killed mid-run (EngineDeadError within seconds, nothing hangs), shutdown that
leaves no actor process and no placement group, ``ray_address`` with provenance, and the
resolve-time refusal when Ray is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Any

import pytest
from background import kill_mid_request
from e2e_utils import pid_alive

from diffserve import Engine, GenerationRequest
from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError, EngineDeadError

pytestmark = pytest.mark.e2e

REQUEST = dict(
    prompt="a fox",
    height=128,
    width=128,
    num_inference_steps=2,
    guidance_scale=0.0,
    seed=42,
    n=1,
    max_sequence_length=64,
)
SETTINGS = dict(dtype="float32", enforce_eager=True, env={})


def _diffserve_groups(ray: Any) -> dict[str, str]:
    """placement group id -> state, for the groups diffserve created (works without the
    dashboard)."""
    return {
        pg_id: entry["state"]
        for pg_id, entry in ray.util.placement_group_table().items()
        if entry["name"].startswith("diffserve-")
    }


def _torch_threads(worker: Any) -> int:
    import torch

    return torch.get_num_threads()


def _niceness(worker: Any) -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def _wait_until(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_ray_serves_attests_its_node_and_matches_uni(
    ray_session: Any, tiny_flux_dir: Any
) -> None:
    groups_before = _diffserve_groups(ray_session)
    with Engine(
        str(tiny_flux_dir), distributed_executor_backend="ray", **SETTINGS
    ) as engine:
        assert engine.executor_name == "ray"
        out = engine.generate(GenerationRequest(**REQUEST))
        (pid,) = engine.worker_pids
        attestation = out.attestation
        assert attestation["executor"] == "ray" and attestation["worker_pid"] == pid
        assert pid != os.getpid() and pid_alive(pid)
        # The node is the Ray node id of the actor: on this one-node cluster, the only
        # node.
        nodes = [node["NodeID"] for node in ray_session.nodes() if node["Alive"]]
        assert attestation["node"] in nodes
        assert attestation["config_fingerprint"] == engine.config.fingerprint
        assert engine.collective_rpc("pid") == [pid]
        # Ray sets OMP_NUM_THREADS=1 in actors; the worker runs on as many threads as an
        # mp worker would.
        driver = os.environ.get("OMP_NUM_THREADS", "")
        expected = (
            int(driver) if driver.isdigit() and int(driver) > 0 else os.cpu_count()
        )
        assert engine.collective_rpc(_torch_threads) == [expected]
        # Ray lowers its workers to niceness 15; the denoiser runs at the driver's, not
        # starved by it.
        assert engine.collective_rpc(_niceness) == [os.getpriority(os.PRIO_PROCESS, 0)]
        new_groups = set(_diffserve_groups(ray_session)) - set(groups_before)
        assert len(new_groups) == 1  # one placement group for the one replica
    # Shutdown: the actor process is gone and the placement group removed.
    assert not pid_alive(pid)
    assert {_diffserve_groups(ray_session)[g] for g in new_groups} == {"REMOVED"}
    with Engine(
        str(tiny_flux_dir), distributed_executor_backend="uni", **SETTINGS
    ) as uni:
        reference = uni.generate(GenerationRequest(**REQUEST))
    assert out.images[0].tobytes() == reference.images[0].tobytes()
    assert out.seeds == reference.seeds == [42]
    assert "node" not in reference.attestation


def test_killing_the_ray_actor_mid_run_fails_fast_and_leaves_nothing(
    ray_session: Any, tiny_flux_dir: Any
) -> None:
    engine = Engine(str(tiny_flux_dir), distributed_executor_backend="ray", **SETTINGS)
    try:
        _kill_mid_run(engine, ray_session)
    finally:
        engine.shutdown()


def _kill_mid_run(engine: Engine, ray_session: Any) -> None:
    (pid,) = engine.worker_pids
    kill_mid_request(
        engine, GenerationRequest(**{**REQUEST, "num_inference_steps": 100}), pid
    )
    assert engine.is_dead and not engine.is_ready
    with pytest.raises(EngineDeadError):
        engine.generate(GenerationRequest(**REQUEST))
    start = time.monotonic()
    engine.shutdown()
    engine.shutdown()  # idempotent
    assert time.monotonic() - start < 15
    assert not pid_alive(pid)
    assert all(state == "REMOVED" for state in _diffserve_groups(ray_session).values())
    # Every CPU bundle went back to the cluster (nothing of this engine holds
    # resources).
    assert _wait_until(
        lambda: (
            ray_session.available_resources().get("CPU")
            == ray_session.cluster_resources().get("CPU")
        ),
        10,
    )


def test_local_ray_and_its_rendezvous_stay_on_loopback(ray_session: Any) -> None:
    # The session's Ray is the executor's own local Ray: connect("") started it
    # (tests/conftest.py), the first Ray of this process, as an engine with ray_address
    # "" starts it.
    from diffserve.executor.ray_actor import rendezvous_address

    assert [node["NodeManagerAddress"] for node in ray_session.nodes()] == ["127.0.0.1"]
    assert ray_session.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    address = ray_session.get(
        ray_session.remote(rendezvous_address).options(num_cpus=0).remote(), timeout=60
    )
    assert address.startswith("tcp://127.0.0.1:"), address


def test_ray_address_is_a_pipeline_key_with_provenance(tmp_path: Any) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("distributed_executor_backend: ray\nray_address: AUTO\n")
    resolved = resolve(model=None, deploy_config=str(deploy), env={})
    assert resolved.ray_address == "auto"
    assert resolved.provenance["ray_address"].layer == "yaml"
    assert resolved.provenance["ray_address"].line == 2
    from_env = resolve(
        model=None,
        deploy_config=str(deploy),
        env={"DIFFSERVE_RAY_ADDRESS": "Head:6379"},
    )
    assert (from_env.ray_address, from_env.provenance["ray_address"].layer) == (
        "head:6379",
        "env",
    )
    from_cli = resolve(
        model=None,
        deploy_config=str(deploy),
        env={"DIFFSERVE_RAY_ADDRESS": "head:6379"},
        overrides={"ray_address": "ray://head:10001"},
    )
    assert (from_cli.ray_address, from_cli.provenance["ray_address"].layer) == (
        "ray://head:10001",
        "cli",
    )
    assert resolve(model=None, env={}).ray_address == ""
    with pytest.raises(ConfigError, match="ray_address.*not a Ray address"):
        resolve(model=None, deploy_config={"ray_address": "http://head"}, env={})
    with pytest.raises(ConfigError, match="pipeline-wide only"):
        resolve(
            model=None,
            deploy_config={"stages": [{"stage_id": 0, "ray_address": "auto"}]},
            env={},
        )


def test_ray_without_the_package_is_refused_at_resolve(
    monkeypatch: pytest.MonkeyPatch, tiny_flux_dir: Any
) -> None:
    # As if `pip install diffserve` ran without the [ray] extra: the Engine refuses
    # before any worker.
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name.split(".")[0] == "ray" else real(name, *args),
    )
    with pytest.raises(ConfigError) as info:
        Engine(str(tiny_flux_dir), distributed_executor_backend="ray", **SETTINGS)
    assert 'pip install "diffserve[ray]"' in str(info.value)
    assert "stages.0.distributed_executor_backend" in str(info.value)
