"""Executor contract, proven on every executor with real workers (threads for uni,
processes for mp, Ray actors in the session's local Ray for ray).

These workers have no model (``model=None``): the contract under test is transport, RPC,
errors, timeouts, death and shutdown. Batches through a real pipeline are covered in
tests/e2e.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError, EngineDeadError, RequestError, WorkerError
from diffserve.executor.factory import make_executor
from diffserve.registry.executors import EXECUTORS as REGISTERED
from diffserve.worker.extension import WorkerExtension

EXECUTORS = ("uni", "mp", "ray")


class ProbeExtension(WorkerExtension):
    """RPC verbs used by the tests; runs inside the worker."""

    def before_load(self, worker) -> None:
        self.hooks = ["before_load"]
        self.rank = worker.rank

    def after_load(self, worker) -> None:
        self.hooks.append("after_load")

    def get_hooks(self) -> list[str]:
        return list(self.hooks)

    def whoami(self) -> tuple[int, int]:
        return self.rank, os.getpid()

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def bad_request(self) -> None:
        raise RequestError("width must be a multiple of 16", param="width")

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def slow_to_free(self) -> SlowToFree:
        return SlowToFree()


class SlowToFree:
    """A reply value whose last reference, the reader thread's, takes a while to drop
    (as a reply's tensors do)."""

    def __del__(self) -> None:
        time.sleep(1.0)


EXT = f"{__name__}.ProbeExtension"


def _config(executor: str, extension: str | None = EXT, ranks: int = 1):
    # Ranks come from the config only (no model: the parallel degree just starts that
    # many workers).
    deploy = {
        "distributed_executor_backend": executor,
        "parallel": {"cfg_parallel_size": ranks},
    }
    if extension:
        deploy["worker_extension_cls"] = extension
    return resolve(model=None, deploy_config=deploy, env={})


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once it is reaped or a
    # zombie.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _needs_runtime(kind: str, request: pytest.FixtureRequest) -> None:
    # Only ray tests start the session's local Ray; a run that selects no ray test never
    # starts it.
    if kind == "ray":
        request.getfixturevalue("ray_session")


# uni runs one rank (registry.executors caps it); mp and ray run as many as the config
# asks for.
RANKS = {"uni": 1, "mp": 2, "ray": 2}


@pytest.fixture(scope="module", params=EXECUTORS)
def executor(request):
    _needs_runtime(request.param, request)
    ex = make_executor(_config(request.param, ranks=RANKS[request.param]))
    assert ex.world_size == RANKS[request.param]
    yield ex
    ex.shutdown()


def test_hooks_ran_and_rpc_is_flat_per_rank_in_rank_order(executor) -> None:
    ranks = executor.world_size
    assert (
        executor.collective_rpc("get_hooks") == [["before_load", "after_load"]] * ranks
    )
    ranks_pids = executor.collective_rpc("whoami")
    assert [rank for rank, _ in ranks_pids] == list(range(ranks))
    pids = [pid for _, pid in ranks_pids]
    assert pids == executor.worker_pids
    if executor.name == "uni":
        assert pids == [os.getpid()]
    else:  # mp: spawned children; ray: actor processes started by the raylet
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert all(_pid_alive(p) for p in pids)
    if executor.name == "ray":
        assert len(executor.nodes) == 2 and all(executor.nodes)
    assert executor.collective_rpc("ping") == ["pong"] * ranks


def test_worker_exception_is_typed_and_worker_survives(executor) -> None:
    with pytest.raises(WorkerError) as info:
        executor.collective_rpc("fail", args=("boom",))
    assert info.value.remote_type == "ValueError"
    assert "boom" in str(info.value) and "Traceback" in info.value.remote_traceback
    with pytest.raises(RequestError) as bad:
        executor.collective_rpc("bad_request")
    assert bad.value.param == "width"
    with pytest.raises(WorkerError, match="no RPC method 'nope'"):
        executor.collective_rpc("nope")
    # Hooks are lifecycle calls, not remote verbs.
    with pytest.raises(WorkerError):
        executor.collective_rpc("before_load", args=(None,))
    assert executor.collective_rpc("ping") == ["pong"] * executor.world_size


def test_timeout_raises_and_late_reply_is_dropped(executor) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        executor.collective_rpc("sleep", args=(1.0,), timeout=0.2)
    assert time.monotonic() - start < 0.9
    # The worker finishes the sleep, then serves the next call; the late reply is not
    # mistaken for it.
    assert (
        executor.collective_rpc("sleep", args=(0.01,), timeout=30)
        == [0.01] * executor.world_size
    )


def test_callable_rpc_gets_the_worker(executor) -> None:
    assert executor.collective_rpc(_rank_of) == list(range(executor.world_size))


def _rank_of(worker) -> int:
    return worker.rank


@pytest.mark.parametrize("kind", EXECUTORS)
def test_bad_extension_path_fails_startup_with_config_error(
    kind: str, request: pytest.FixtureRequest
) -> None:
    _needs_runtime(kind, request)
    with pytest.raises(ConfigError, match="worker_extension_cls"):
        make_executor(
            _config(kind, extension="no_such_module_xyz.Ext"), ready_timeout=120
        )


@pytest.mark.parametrize("kind", EXECUTORS)
def test_shutdown_is_idempotent_and_later_calls_fail_fast(
    kind: str, request: pytest.FixtureRequest
) -> None:
    _needs_runtime(kind, request)
    ex = make_executor(_config(kind))
    pids = list(ex.worker_pids)
    start = time.monotonic()
    ex.shutdown()
    ex.shutdown()
    assert time.monotonic() - start < 15
    with pytest.raises(EngineDeadError):
        ex.collective_rpc("ping")
    if kind != "uni":  # no worker process (mp child, ray actor) outlives shutdown
        assert not any(_pid_alive(p) for p in pids)


def test_uni_shutdown_leaves_no_thread_of_its_own() -> None:
    # A daemon thread still freeing a reply's tensors when the interpreter finalizes
    # exits through torch's C++ frames and aborts the process ("terminate called without
    # an active exception", seen at a uni Engine's exit): shutdown joins the worker and
    # its reader, so nothing of the executor is left running.
    ex = make_executor(_config("uni", extension=EXT))
    # Ours dropped here.
    assert [type(v).__name__ for v in ex.collective_rpc("slow_to_free")] == [
        "SlowToFree"
    ]
    ex.shutdown()
    assert [
        t.name for t in threading.enumerate() if t.name.startswith("diffserve-uni-")
    ] == []


@pytest.mark.parametrize("kind", ["mp", "ray"])
def test_sigkill_fails_in_flight_call_fast_and_leaves_no_child(
    kind: str, request: pytest.FixtureRequest
) -> None:
    _needs_runtime(kind, request)
    ex = make_executor(_config(kind, ranks=2))
    deaths: list[EngineDeadError] = []
    ex.on_dead = deaths.append
    pids = list(ex.worker_pids)
    result: dict[str, BaseException] = {}

    def call() -> None:
        try:
            ex.collective_rpc("sleep", args=(60.0,))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            result["error"] = exc

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.5)
    killed_at = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    caller.join(timeout=10)
    assert not caller.is_alive()
    assert isinstance(result.get("error"), EngineDeadError)
    assert time.monotonic() - killed_at < 10
    assert deaths and "died" in str(deaths[0])
    with pytest.raises(EngineDeadError):
        ex.collective_rpc("ping")
    with pytest.raises(EngineDeadError):
        ex.check_health()
    start = time.monotonic()
    # rank 0 is still sleeping: shutdown escalates (SIGTERM on mp, ray.kill on ray) and
    # returns
    ex.shutdown()
    assert time.monotonic() - start < 15
    assert not any(_pid_alive(p) for p in pids)


def test_mp_worker_exits_when_its_parent_is_killed(tmp_path) -> None:
    import programs

    # tests/mp_parent.py prints its worker's pid once the executor is ready.
    tests_dir = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": programs.python_path_with(tests_dir)}
    log = tmp_path / "parent.log"
    log.touch()
    parent = programs.start(
        "mp_parent", [], env, log, stderr_path=tmp_path / "parent.err"
    )
    try:
        deadline = time.monotonic() + 60
        while (
            not log.read_text().strip()
            and parent.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        worker_pid = int(log.read_text().split()[0])
        assert _pid_alive(worker_pid)
    finally:
        parent.kill()  # SIGKILL: no atexit, no finalizer runs in the parent
        parent.wait(30)
    deadline = time.monotonic() + 10
    while _pid_alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(worker_pid), "worker outlived its parent"


# (num_replicas > 1 runs now: each replica is its own executor, engine/replicas.py.)
@pytest.mark.parametrize(
    "field, where", [({"parallel": {"tensor_parallel_size": 2}}, "stages.0.parallel")]
)
def test_unsupported_layouts_are_refused_not_downgraded(
    field: dict, where: str
) -> None:
    # Refused from the executor registry's rules before any worker starts.
    config = resolve(
        model=None,
        deploy_config={"distributed_executor_backend": "uni", **field},
        env={},
    )
    with pytest.raises(ConfigError) as info:
        make_executor(config)
    assert where in str(info.value)


def test_an_unregistered_executor_is_refused_at_resolve() -> None:
    with pytest.raises(ConfigError, match="valid values: uni, mp, ray"):
        resolve(
            model=None, deploy_config={"distributed_executor_backend": "dask"}, env={}
        )


def test_an_executor_whose_package_is_missing_is_refused_at_resolve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The registry seam: ray's spec names a module that cannot be found. Refused when
    # the config is resolved (no executor built, nothing imported), naming the extra;
    # never a fallback to mp.
    monkeypatch.setitem(
        REGISTERED,
        "ray",
        dataclasses.replace(REGISTERED["ray"], requires="no_such_module_xyz"),
    )
    with pytest.raises(ConfigError) as info:
        resolve(
            model=None, deploy_config={"distributed_executor_backend": "ray"}, env={}
        )
    assert 'pip install "diffserve[ray]"' in str(info.value)
    assert "stages.0.distributed_executor_backend" in str(info.value)
    assert "no_such_module_xyz" in str(info.value)
    # The same spec is fine when nothing asks for it.
    assert resolve(
        model=None, deploy_config={"distributed_executor_backend": "mp"}, env={}
    )


def test_ray_without_the_ray_package_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name.split(".")[0] == "ray" else real(name, *args),
    )
    with pytest.raises(
        ConfigError,
        match=r'executor .ray. needs the .ray. package.*pip install "diffserve\[ray\]"',
    ):
        resolve(model=None, overrides={"distributed_executor_backend": "ray"}, env={})


def test_a_model_that_cannot_run_parallel_is_refused(tiny_flux_dir) -> None:
    config = resolve(
        model=str(tiny_flux_dir),
        deploy_config={
            "distributed_executor_backend": "mp",
            "parallel": {"ring_degree": 2},
        },
        env={},
    )
    with pytest.raises(ConfigError, match="FluxPipeline does not run") as info:
        make_executor(config)
    assert "stages.0.parallel" in str(info.value)
