"""Server and worker lifecycle under signals: SIGTERM during the model load and with a
request in flight (the server exits within its grace period), SIGKILL during the load
and mid-batch, and a parent killed while its worker loads. In every case no worker
process is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import programs
import pytest
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

pytestmark = pytest.mark.e2e

# uvicorn drains connections for up to 10 s, then the engine shuts its workers down
# (bounded waits).
GRACE_S = 20.0
ORPHAN_S = 5.0  # a worker notices its parent is gone within ~0.5 s (watchdog thread)


@pytest.fixture(autouse=True)
def server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # `diffserve serve` (and its spawned workers) must import faults_ext: put this
    # folder on its path.
    monkeypatch.setenv("PYTHONPATH", programs.python_path_with(HERE))


def _loading_workers(server: ServerProcess) -> list[int]:
    """The worker processes of a server that is still loading (they exist before they
    are ready)."""
    server.wait_for("/health")
    assert wait_until(lambda: bool(worker_children(server.proc.pid)), 60.0), (
        server.log()
    )
    return worker_children(server.proc.pid)


def _post_in_thread(url: str, steps: int) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def send() -> None:
        try:
            box["response"] = httpx.post(
                url + "/v1/images/generations",
                timeout=60,
                json={"prompt": "a fox", "size": "64x64", "num_inference_steps": steps},
            )
        except (
            httpx.HTTPError
        ) as exc:  # a connection closed by the exiting server also ends the wait
            box["error"] = exc

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, box


def _sigterm_and_check(server: ServerProcess, workers: list[int]) -> None:
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the server did not exit within {GRACE_S}s of SIGTERM:\n{server.log()}"
        )
    assert time.monotonic() - start < GRACE_S
    assert wait_gone(workers, ORPHAN_S) == [], "a worker outlived the server"


def _sigkill_and_check(server: ServerProcess, workers: list[int]) -> None:
    # no handler, no finalizer: only the workers' own watchdog can end them
    server.proc.kill()
    server.proc.wait(10)
    assert wait_gone(workers, ORPHAN_S) == [], "a worker outlived its killed server"


def test_sigterm_during_model_load(
    tiny_flux_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAULTS_LOAD_S", "1")
    server = ServerProcess(
        [
            str(tiny_flux_dir),
            "--deploy-config",
            str(deploy(tmp_path, "mp", "SlowLoadExtension")),
        ],
        tmp_path / "server.log",
    )
    workers: list[int] = []
    try:
        workers = _loading_workers(server)
        # Still loading.
        assert httpx.get(server.url + "/ready", timeout=5).status_code == 503
        _sigterm_and_check(server, workers)
    finally:
        kill_all([p for p in workers if pid_alive(p)])
        server.stop()


def test_sigterm_with_a_request_in_flight(
    tiny_flux_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAULTS_STEP_S", "0.3")
    server = ServerProcess(
        [
            str(tiny_flux_dir),
            "--deploy-config",
            str(deploy(tmp_path, "mp", "SlowStepExtension")),
        ],
        tmp_path / "server.log",
    )
    workers: list[int] = []
    try:
        server.wait_for("/ready")
        workers = worker_children(server.proc.pid)
        assert workers
        thread, box = _post_in_thread(server.url, steps=4)  # over a second of denoising
        time.sleep(1.0)
        assert thread.is_alive()
        _sigterm_and_check(server, workers)
        thread.join(5)
        assert not thread.is_alive(), "the in-flight request never got an answer"
        # Drained (200) or failed as the engine shut down (503), never left hanging.
        assert "error" in box or box["response"].status_code in (200, 503), box
    finally:
        kill_all([p for p in workers if pid_alive(p)])
        server.stop()


def test_sigkill_during_model_load(
    tiny_flux_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAULTS_LOAD_S", "60")
    server = ServerProcess(
        [
            str(tiny_flux_dir),
            "--deploy-config",
            str(deploy(tmp_path, "mp", "SlowLoadExtension")),
        ],
        tmp_path / "server.log",
    )
    workers: list[int] = []
    try:
        workers = _loading_workers(server)
        _sigkill_and_check(server, workers)
    finally:
        kill_all([p for p in workers if pid_alive(p)])
        server.stop()


def test_sigkill_mid_batch_with_a_worker_stuck_in_a_step(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    # The step never returns, so the between-steps parent check never runs: only the
    # watchdog can help.
    server = ServerProcess(
        [
            str(tiny_flux_dir),
            "--deploy-config",
            str(deploy(tmp_path, "mp", "HangExtension")),
        ],
        tmp_path / "server.log",
    )
    workers: list[int] = []
    try:
        server.wait_for("/ready")
        workers = worker_children(server.proc.pid)
        assert workers
        thread, _ = _post_in_thread(server.url, steps=2)
        time.sleep(1.0)
        assert thread.is_alive()
        _sigkill_and_check(server, workers)
    finally:
        kill_all([p for p in workers if pid_alive(p)])
        server.stop()


def test_worker_exits_when_its_parent_dies_during_load(tmp_path: Path) -> None:
    # tests/mp_parent.py: an mp executor whose worker sleeps 60 s in before_load
    # (faults_ext, on PYTHONPATH).
    env = {
        **os.environ,
        "FAULTS_LOAD_S": "60",
        "PYTHONPATH": programs.python_path_with(HERE.parent),
    }
    parent = programs.start(
        "mp_parent", ["faults_ext.SlowLoadExtension"], env, tmp_path / "parent.log"
    )
    workers: list[int] = []
    try:
        assert wait_until(lambda: bool(worker_children(parent.pid)), 60.0)
        workers = worker_children(parent.pid)
        time.sleep(0.5)  # the worker is inside before_load now (it sleeps 60 s there)
        assert all(pid_alive(p) for p in workers) and parent.poll() is None
    finally:
        parent.kill()  # SIGKILL: no atexit, no finalizer runs in the parent
        parent.wait(10)
    try:
        assert wait_gone(workers, ORPHAN_S) == [], (
            "the loading worker outlived its parent"
        )
    finally:
        kill_all([p for p in workers if pid_alive(p)])
