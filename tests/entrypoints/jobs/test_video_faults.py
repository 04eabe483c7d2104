"""The video jobs lose nothing: one real ``diffserve serve`` of the tiny Wan on
127.0.0.1 (mp workers, state in a temporary directory, a 5 s TTL, an 8 s job deadline
and a pause after every denoise step), its faults in file order: DELETE mid-run frees
the engine for the next job; TTL expiry takes row and files together; a disk error fails
the job, not the server; a job over its deadline fails with ``deadline_exceeded``; the
server SIGKILLed mid-job and restarted on its port fails the job with ``server_restart``
(a job requeued instead runs to ``completed``: the lease takeover in
test_video_instances.py); a SIGKILLed worker fails its job, and the server still
answers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import programs
import pytest
from procs import worker_children
from server_process import ServerProcess
from video_requests import LONG, SHORT

HERE = Path(__file__).resolve().parent
# The worker pauses after every step (paced_steps.py): the long jobs below sleep through
# their seconds instead of computing, which none of the faults depends on.
DEPLOY = """
dtype: float32
enforce_eager: true
distributed_executor_backend: mp
worker_extension_cls: paced_steps.PacedStepsExtension
warmup:
  enabled: false
server:
  max_steps: 100000
  video_ttl_s: 5
  job_deadline_s: 8
"""


@dataclass
class Harness:
    tmp: Path
    model: Path
    server: ServerProcess | None = None

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    def start(self, port: int | None = None, wait: str = "/ready") -> ServerProcess:
        (self.tmp / "deploy.yaml").write_text(DEPLOY)
        self.server = ServerProcess(
            [
                str(self.model),
                "--deploy-config",
                str(self.tmp / "deploy.yaml"),
                "--state-dir",
                str(self.state),
                "--served-model-name",
                "tiny-wan",
            ],
            self.tmp / "server.log",
            port=port,
            env={"PYTHONPATH": _pythonpath()},
        )
        self.server.wait_for(wait)
        return self.server

    def files(self, video_id: str) -> list[Path]:
        return list((self.state / "videos").glob(f"{video_id}*"))


def _pythonpath() -> str:
    """The server's path with this folder on it, so its workers can import
    paced_steps."""
    return programs.python_path_with(HERE)


@pytest.fixture(scope="module")
def harness(
    tmp_path_factory: pytest.TempPathFactory, tiny_wan_dir: Path
) -> Iterator[Harness]:
    running = Harness(tmp_path_factory.mktemp("faults"), tiny_wan_dir)
    running.start()
    try:
        yield running
    finally:
        assert running.server is not None
        running.server.stop()


def create(server: ServerProcess, body: dict[str, Any]) -> str:
    answer = httpx.post(server.url + "/v1/videos", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def get(server: ServerProcess, video_id: str) -> httpx.Response:
    return httpx.get(f"{server.url}/v1/videos/{video_id}", timeout=30)


def wait_status(
    server: ServerProcess,
    video_id: str,
    statuses: tuple[str, ...],
    timeout: float = 120,
) -> dict:
    deadline = time.monotonic() + timeout
    video: dict = {}
    while time.monotonic() < deadline:
        video = get(server, video_id).json()
        if video.get("status") in statuses:
            return video
        time.sleep(0.05)
    raise TimeoutError(
        f"{video_id} not {statuses} within {timeout} s: {video}\n{server.log()[-3000:]}"
    )


def test_delete_mid_run_frees_the_engine_for_the_next_job(harness: Harness) -> None:
    server = harness.server
    assert server is not None
    endless = create(server, LONG)
    wait_status(server, endless, ("in_progress",))
    deleted = httpx.delete(f"{server.url}/v1/videos/{endless}", timeout=30)
    assert deleted.json() == {"id": endless, "object": "video.deleted", "deleted": True}
    assert get(server, endless).status_code == 404
    # One engine slot: it runs only because the endless one let go.
    quick = create(server, SHORT)
    assert (
        wait_status(server, quick, ("completed", "failed"), timeout=60)["status"]
        == "completed"
    )
    assert not harness.files(endless)


def test_ttl_expiry_takes_row_and_files_together(harness: Harness) -> None:
    server = harness.server
    assert server is not None
    done = wait_status(server, create(server, SHORT), ("completed", "failed"))
    assert (
        done["status"] == "completed" and done["expires_at"] - done["completed_at"] == 5
    )
    assert harness.files(done["id"])
    # Expires_at is whole seconds, rounded down.
    time.sleep(max(0.0, done["expires_at"] + 1 - time.time()) + 0.5)
    assert (
        httpx.get(
            f"{server.url}/v1/videos/{done['id']}/content", timeout=30
        ).status_code
        == 404
    )
    # The sweep runs every few seconds: then the row and the files go.
    deadline = time.monotonic() + 15
    while get(server, done["id"]).status_code != 404 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert get(server, done["id"]).status_code == 404 and not harness.files(done["id"])


def test_a_disk_error_fails_the_job_and_the_server_serves_on(harness: Harness) -> None:
    server = harness.server
    assert server is not None
    videos = harness.state / "videos"
    shutil.move(videos, harness.tmp / "moved")
    videos.write_text("not a directory")  # even root cannot write into it
    try:
        broken = wait_status(server, create(server, SHORT), ("completed", "failed"))
    finally:
        videos.unlink()
        shutil.move(harness.tmp / "moved", videos)
    assert (
        broken["status"] == "failed"
        and broken["error"]["code"] == "artifact_write_failed"
    ), broken
    assert (
        wait_status(server, create(server, SHORT), ("completed", "failed"))["status"]
        == "completed"
    )


def test_a_job_over_its_deadline_fails_and_leaves_nothing(harness: Harness) -> None:
    server = harness.server
    assert server is not None
    late = create(server, LONG)
    video = wait_status(server, late, ("failed",), timeout=60)
    assert video["error"]["code"] == "deadline_exceeded", video
    assert video["completed_at"] - video["created_at"] >= 8 and not harness.files(late)


def test_sigkill_mid_job_then_restart_fails_it_with_server_restart(
    harness: Harness,
) -> None:
    server = harness.server
    assert server is not None
    doomed = create(server, LONG)
    wait_status(server, doomed, ("in_progress",))
    workers = worker_children(server.proc.pid)
    server.kill()
    # Orphaned mp workers exit with their parent anyway; none outlives the test.
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # The same instance name: it recovers its own jobs before it answers at all (the
    # jobs' routes need no model: they answer while it loads). Read it before the TTL
    # takes the failed job away.
    server = harness.start(port=server.port, wait="/health")
    video = get(server, doomed).json()
    assert video["status"] == "failed" and video["error"]["code"] == "server_restart", (
        video
    )
    assert not harness.files(doomed)
    server.wait_for("/ready")
    assert (
        wait_status(server, create(server, SHORT), ("completed", "failed"))["status"]
        == "completed"
    )


def test_a_sigkilled_worker_fails_its_job_and_the_server_answers(
    harness: Harness,
) -> None:
    server = harness.server
    assert server is not None
    victim = create(server, LONG)
    wait_status(server, victim, ("in_progress",))
    for pid in worker_children(server.proc.pid):
        os.kill(pid, signal.SIGKILL)
    failed = wait_status(server, victim, ("failed",), timeout=60)
    assert failed["error"]["code"] == "engine_dead", failed
    # Its only replica is gone.
    assert httpx.get(server.url + "/health", timeout=10).status_code == 503
    # The jobs still answer.
    assert httpx.get(server.url + "/v1/videos", timeout=10).status_code == 200
