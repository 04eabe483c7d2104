"""Worker faults the engine must turn into a dead engine (503) instead of a hang or 500s
forever: a worker hung in a denoise step (uni and mp), a SIGSTOPped mp worker, a worker
that fails every batch, and an mp reply the parent cannot decode. Deadlines are tiny
(``batch_deadline_floor_s: 2``, no per-megapixel term) so every case resolves in
seconds."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import faults_ext
import httpx
import programs
import pytest
from background import generate_in_background
from faults_proc import (
    HERE,
    deploy,
    kill_all,
    pid_alive,
    wait_gone,
    wait_until,
    worker_children,
)
from server_process import ServerProcess

from diffserve import Engine, GenerationRequest
from diffserve.config.resolve import resolve
from diffserve.config.server_schema import ServerConfig
from diffserve.engine.step_watch import STALL_FLOOR_S
from diffserve.engine.watchdog import FailureStreak, batch_deadline_s
from diffserve.errors import EngineDeadError, WorkerError
from diffserve.executor.factory import make_executor

pytestmark = pytest.mark.e2e

DEADLINE_S = 2.0
# "the deadline plus a few seconds": detection, SIGKILL and the 503 on a 2-core machine
SLACK_S = 5.0
FAST_DEADLINE = {"batch_deadline_floor_s": 2, "batch_deadline_s_per_mpix_step": 0}
BODY = {"prompt": "a fox", "size": "64x64", "num_inference_steps": 2}


def request(prompt: str = "a fox") -> GenerationRequest:
    return GenerationRequest(
        prompt=prompt,
        height=64,
        width=64,
        num_inference_steps=2,
        guidance_scale=0.0,
        seed=1,
        max_sequence_length=64,
    )


@pytest.fixture
def server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # `diffserve serve` (and its spawned workers) must import faults_ext: put this
    # folder on its path.
    monkeypatch.setenv("PYTHONPATH", programs.python_path_with(HERE))


def _post_in_thread(url: str) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def send() -> None:
        try:
            box["response"] = httpx.post(
                url + "/v1/images/generations", json=BODY, timeout=60
            )
        except (
            httpx.HTTPError
        ) as exc:  # recorded: the assertion says what was expected instead
            box["error"] = exc
        box["done_at"] = time.monotonic()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, box


def _assert_dead_over_http(
    server: ServerProcess,
    sent_at: float,
    thread: threading.Thread,
    box: dict[str, Any],
    within_s: float = DEADLINE_S,
    why: str = f"exceeded its deadline of {DEADLINE_S:.1f}s",
) -> None:
    """/health turns 503 within ``within_s`` plus slack, the in-flight request gets a
    503, a new one gets a 503 at once, and the log says ``why``."""
    assert wait_until(
        lambda: httpx.get(server.url + "/health", timeout=5).status_code == 503,
        within_s + SLACK_S,
        interval=0.1,
    ), "the hung worker was never noticed"
    assert time.monotonic() - sent_at < within_s + SLACK_S
    thread.join(SLACK_S)
    assert not thread.is_alive(), "the in-flight request hangs"
    assert "response" in box, box
    assert (
        box["response"].status_code == 503
        and box["response"].json()["error"]["code"] == "engine_dead"
    )
    start = time.monotonic()
    later = httpx.post(server.url + "/v1/images/generations", json=BODY, timeout=10)
    assert later.status_code == 503 and time.monotonic() - start < 2.0
    assert why in server.log()


def test_sigstopped_mp_worker_is_found_by_its_step_heartbeat(
    tiny_flux_dir: Path, tmp_path: Path, server_env: None
) -> None:
    """The deployment's default deadlines (a 120 s floor): a worker that stops reporting
    steps is found by the step heartbeat within max(10 s, 5 x its measured pace), from
    two one-step 128x128 images it served."""
    path = deploy(tmp_path, "mp", None)
    server = ServerProcess(
        [str(tiny_flux_dir), "--deploy-config", str(path)], tmp_path / "server.log"
    )
    workers: list[int] = []
    try:
        server.wait_for("/ready")
        workers = worker_children(server.proc.pid)
        assert len(workers) == 1, workers
        for _ in range(2):  # the pace it learns
            served = httpx.post(
                server.url + "/v1/images/generations",
                timeout=60,
                json={**BODY, "size": "128x128", "num_inference_steps": 1},
            )
            assert served.status_code == 200, served.text
        os.kill(workers[0], signal.SIGSTOP)
        sent_at = time.monotonic()
        thread, box = _post_in_thread(server.url)
        _assert_dead_over_http(
            server,
            sent_at,
            thread,
            box,
            within_s=STALL_FLOOR_S,
            why="made no progress for",
        )
        # SIGKILLed and reaped by the server: no stopped process is left behind.
        assert wait_gone(workers, 5.0) == []
    finally:
        kill_all([p for p in workers if pid_alive(p)])
        server.stop()


def _generate_in_thread(engine: Engine) -> tuple[threading.Thread, dict[str, Any]]:
    return generate_in_background(engine, request(), timeout=60)


def test_mp_hung_step_kills_the_worker_and_the_engine(tiny_flux_dir: Path) -> None:
    engine = Engine(
        str(tiny_flux_dir),
        deploy_config={
            "dtype": "float32",
            "enforce_eager": True,
            "distributed_executor_backend": "mp",
            "worker_extension_cls": "faults_ext.HangExtension",
            "server": FAST_DEADLINE,
        },
        env={},
    )
    pids = list(engine.worker_pids)
    try:
        time.sleep(1.2)  # idle: the loop still beats (at least every ~0.5 s)
        assert engine.loop_state == "idle" and engine.heartbeat_age_s < 1.0
        sent_at = time.monotonic()
        thread, box = _generate_in_thread(engine)
        assert wait_until(lambda: engine.loop_state == "running", 5.0)
        time.sleep(1.0)  # spent anyway: the deadline is 2 s
        # No beat while a batch runs: an operator sees it stuck.
        assert engine.heartbeat_age_s >= 0.9
        thread.join(DEADLINE_S + SLACK_S)
        assert not thread.is_alive(), "the request hangs"
        assert isinstance(box.get("error"), EngineDeadError), box
        assert (
            "deadline" in str(box["error"])
            and box["done_at"] - sent_at < DEADLINE_S + SLACK_S
        )
        assert engine.is_dead and engine.loop_state == "dead"
        assert wait_gone(pids, 5.0) == [], "the hung worker process survived"
        start = time.monotonic()
        with pytest.raises(EngineDeadError):
            engine.generate(request())
        assert time.monotonic() - start < 1.0
    finally:
        start = time.monotonic()
        engine.shutdown()
        assert time.monotonic() - start < 10
        kill_all([p for p in pids if pid_alive(p)])


def test_uni_hung_step_marks_the_engine_dead(tiny_flux_dir: Path) -> None:
    engine = Engine(
        str(tiny_flux_dir),
        deploy_config={
            "dtype": "float32",
            "enforce_eager": True,
            "distributed_executor_backend": "uni",
            "worker_extension_cls": "faults_ext.HangExtension",
            "server": FAST_DEADLINE,
        },
        env={},
    )
    try:
        sent_at = time.monotonic()
        thread, box = _generate_in_thread(engine)
        thread.join(DEADLINE_S + SLACK_S)
        assert isinstance(box.get("error"), EngineDeadError), box
        assert (
            "deadline" in str(box["error"])
            and box["done_at"] - sent_at < DEADLINE_S + SLACK_S
        )
        assert engine.is_dead and engine.loop_state == "dead"
        with pytest.raises(EngineDeadError):
            engine.collective_rpc("ping", timeout=5)
        time.sleep(1.0)
        # The loop thread is not the one that hangs: it keeps beating (and does not
        # spin) while dead.
        assert engine.heartbeat_age_s < 1.0
    finally:
        start = time.monotonic()
        engine.shutdown()
        # Does not wait 30 s for a thread known to be hung.
        assert time.monotonic() - start < 5
        faults_ext.RELEASE.set()


def test_consecutive_failures_mark_the_engine_dead(tiny_flux_dir: Path) -> None:
    engine = Engine(
        str(tiny_flux_dir),
        deploy_config={
            "dtype": "float32",
            "enforce_eager": True,
            "distributed_executor_backend": "uni",
            "worker_extension_cls": "faults_ext.FailExtension",
            "server": {"max_consecutive_failures": 2},
        },
        env={},
    )
    try:
        with pytest.raises(WorkerError):
            engine.generate(request(), timeout=30)
        assert not engine.is_dead
        with pytest.raises(WorkerError):
            engine.generate(request(), timeout=30)
        assert wait_until(lambda: engine.is_dead, 2.0)
        with pytest.raises(
            EngineDeadError, match="2 consecutive batches failed.*injected failure"
        ):
            engine.check_health()
        with pytest.raises(EngineDeadError):
            engine.generate(request(), timeout=5)
    finally:
        engine.shutdown()


def test_undecodable_mp_reply_marks_the_executor_dead() -> None:
    config = resolve(
        model=None,
        deploy_config={
            "distributed_executor_backend": "mp",
            "worker_extension_cls": "faults_ext.GarbageExtension",
        },
        env={},
    )
    executor = make_executor(config)
    deaths: list[EngineDeadError] = []
    executor.on_dead = deaths.append
    pids = list(executor.worker_pids)
    try:
        assert executor.collective_rpc("ping_ext", timeout=10) == ["pong"]
        start = time.monotonic()
        # A timeout here would mean the reader died silently and the call hung.
        with pytest.raises(
            EngineDeadError, match="RuntimeError: this reply cannot be decoded"
        ):
            executor.collective_rpc("garbage", timeout=10)
        assert time.monotonic() - start < 5
        assert executor.is_dead and len(deaths) == 1
        with pytest.raises(EngineDeadError):
            executor.collective_rpc("ping_ext", timeout=5)
    finally:
        start = time.monotonic()
        executor.shutdown()
        assert time.monotonic() - start < 15
    assert wait_gone(pids, 5.0) == []


def test_uni_reader_failure_marks_the_executor_dead() -> None:
    executor = make_executor(
        resolve(
            model=None, deploy_config={"distributed_executor_backend": "uni"}, env={}
        )
    )

    def broken(reply: Any) -> None:
        raise ValueError("reader bug")

    try:
        executor.calls.deliver = broken  # type: ignore[method-assign]
        with pytest.raises(EngineDeadError, match="ValueError: reader bug"):
            executor.collective_rpc("ping", timeout=10)
        assert executor.is_dead
    finally:
        executor.shutdown()


# --- units: the deadline formula and the failure streak
# ---------------------------------------------


def test_batch_deadline_grows_with_steps_pixels_and_images() -> None:
    server = ServerConfig(
        batch_deadline_floor_s=10, batch_deadline_s_per_mpix_step=30.0
    )
    one = GenerationRequest(
        prompt="x", height=1024, width=512, num_inference_steps=4, n=2
    )
    assert batch_deadline_s([one], server) == pytest.approx(
        10 + 30.0 * 4 * (1024 * 512 / 1e6) * 2
    )
    # The model's default size, as admission filled it; a batch sums its requests'
    # images.
    default = GenerationRequest(
        prompt="x", height=512, width=512, num_inference_steps=2
    )
    assert batch_deadline_s([default, default], server) == pytest.approx(
        10 + 30.0 * 2 * 0.262144 * 2
    )
    # A request no model admitted (an RPC-only executor's) counts 1024x1024.
    assert batch_deadline_s(
        [GenerationRequest(prompt="x", num_inference_steps=1)], server
    ) == pytest.approx(10 + 30.0 * 1.048576)
    assert (
        batch_deadline_s(
            [one],
            ServerConfig(batch_deadline_floor_s=2, batch_deadline_s_per_mpix_step=0.0),
        )
        == 2.0
    )
    # A video's pixels are every frame's: 17 frames get 17 times the time of one.
    video = GenerationRequest(
        prompt="x", height=512, width=512, num_inference_steps=4, num_frames=17
    )
    assert batch_deadline_s([video], server) == pytest.approx(
        10 + 30.0 * 4 * 0.262144 * 17
    )


def test_failure_streak_counts_in_a_row_and_resets_on_success() -> None:
    streak = FailureStreak(2)
    assert streak.record("error", RuntimeError("a")) is None
    assert streak.record("ok") is None  # a success resets
    assert streak.record("error", RuntimeError("b")) is None
    assert streak.record("aborted") is None  # neither counts nor resets
    dead = streak.record("error", RuntimeError("c"))
    assert (
        isinstance(dead, EngineDeadError)
        and "2 consecutive" in str(dead)
        and "RuntimeError: c" in str(dead)
    )
