"""The video jobs lose nothing (a real ``diffserve serve`` of the tiny Wan on 127.0.0.1, its state in a temporary
directory): a server SIGKILLed mid-job and restarted on its port fails the job with ``server_restart``, or runs it
again to ``completed`` with ``--requeue-interrupted``; a SIGKILLed worker fails its job and nothing else; DELETE
mid-run frees the engine for the next job; TTL expiry takes row and files together; a disk error fails the job,
not the server; a job over its deadline fails with ``deadline_exceeded``."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from procs import worker_children
from server_process import ServerProcess

DEPLOY = """
dtype: float32
enforce_eager: true
warmup:
  enabled: false
server:
  max_steps: 100000
"""
SHORT = {"prompt": "a ball", "size": "64x48", "num_frames": 5, "num_inference_steps": 2, "seed": 1}
LONG = {**SHORT, "num_inference_steps": 100000}  # runs until something stops it


def start(tmp: Path, model: Path, state: Path, *flags: str, port: int | None = None) -> ServerProcess:
    deploy = tmp / "deploy.yaml"
    deploy.write_text(DEPLOY)
    server = ServerProcess([str(model), "--deploy-config", str(deploy), "--state-dir", str(state),
                            "--served-model-name", "tiny-wan", *flags], tmp / "server.log", port=port)
    server.wait_for("/ready")
    return server


def create(server: ServerProcess, body: dict[str, Any]) -> str:
    answer = httpx.post(server.url + "/v1/videos", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def get(server: ServerProcess, video_id: str) -> httpx.Response:
    return httpx.get(f"{server.url}/v1/videos/{video_id}", timeout=30)


def wait_status(server: ServerProcess, video_id: str, statuses: tuple[str, ...], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = get(server, video_id).json()
        if video.get("status") in statuses:
            return video
        time.sleep(0.05)
    raise TimeoutError(f"{video_id} not {statuses} within {timeout} s: {video}\n{server.log()[-3000:]}")


def test_sigkill_mid_job_then_restart_fails_it_or_runs_it_again(tmp_path: Path, tiny_wan_dir: Path) -> None:
    tmp = tmp_path
    state = tmp / "state"
    server = start(tmp, tiny_wan_dir, state)
    try:
        doomed = create(server, LONG)
        wait_status(server, doomed, ("in_progress",))
        server.kill()
        server = start(tmp, tiny_wan_dir, state, port=server.port)  # the same instance: it recovers its own jobs at once
        video = get(server, doomed).json()
        assert video["status"] == "failed" and video["error"]["code"] == "server_restart", video
        assert not list((state / "videos").glob(f"{doomed}*"))

        again = create(server, {**SHORT, "num_inference_steps": 60})
        wait_status(server, again, ("in_progress",))
        server.kill()
        server = start(tmp, tiny_wan_dir, state, "--requeue-interrupted", port=server.port)
        video = wait_status(server, again, ("completed", "failed"))
        assert video["status"] == "completed", video
        assert httpx.get(f"{server.url}/v1/videos/{again}/content", timeout=30).status_code == 200
    finally:
        server.stop()


def test_delete_mid_run_frees_the_engine_and_a_killed_worker_fails_only_its_job(tmp_path: Path, tiny_wan_dir: Path) -> None:
    tmp = tmp_path
    state = tmp / "state"
    server = start(tmp, tiny_wan_dir, state, "--distributed-executor-backend", "mp", "--video-ttl-s", "3")
    try:
        endless = create(server, LONG)
        wait_status(server, endless, ("in_progress",))
        deleted = httpx.delete(f"{server.url}/v1/videos/{endless}", timeout=30)
        assert deleted.json() == {"id": endless, "object": "video.deleted", "deleted": True}
        assert get(server, endless).status_code == 404
        quick = create(server, SHORT)  # one engine slot: it runs only if the endless one let go
        done = wait_status(server, quick, ("completed", "failed"), timeout=60)
        assert done["status"] == "completed", done

        # TTL: expires_at is when row and files go; the content is 404 from then on, the row soon after.
        assert done["expires_at"] - done["completed_at"] == 3
        assert list((state / "videos").glob(f"{quick}*"))
        time.sleep(max(0.0, done["expires_at"] - time.time()) + 0.5)
        assert httpx.get(f"{server.url}/v1/videos/{quick}/content", timeout=30).status_code == 404
        deadline = time.monotonic() + 15
        while get(server, quick).status_code != 404 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert get(server, quick).status_code == 404 and not list((state / "videos").glob(f"{quick}*"))

        # A disk error while publishing: the job fails naming it, nothing is left, the server serves on.
        videos = state / "videos"
        shutil.move(videos, tmp / "moved")
        videos.write_text("not a directory")
        broken = wait_status(server, create(server, SHORT), ("completed", "failed"))
        assert broken["status"] == "failed" and broken["error"]["code"] == "artifact_write_failed", broken
        videos.unlink()
        shutil.move(tmp / "moved", videos)

        # A worker SIGKILLed mid-job: that job fails with the engine's error; the server answers.
        victim = create(server, LONG)
        wait_status(server, victim, ("in_progress",))
        for pid in worker_children(server.proc.pid):
            os.kill(pid, signal.SIGKILL)
        failed = wait_status(server, victim, ("failed",), timeout=60)
        assert failed["error"]["code"], failed
        assert httpx.get(server.url + "/health", timeout=10).status_code in (200, 503)
        assert httpx.get(server.url + "/v1/videos", timeout=10).status_code == 200
    finally:
        server.stop()


def test_a_job_over_its_deadline_fails_and_leaves_nothing(tmp_path: Path, tiny_wan_dir: Path) -> None:
    tmp = tmp_path
    state = tmp / "state"
    server = start(tmp, tiny_wan_dir, state, "--job-deadline-s", "2")
    try:
        late = create(server, LONG)
        video = wait_status(server, late, ("failed",), timeout=60)
        assert video["error"]["code"] == "deadline_exceeded", video
        assert not list((state / "videos").glob(f"{late}*"))
        assert wait_status(server, create(server, SHORT), ("completed",))["progress"] == 100
    finally:
        server.stop()
