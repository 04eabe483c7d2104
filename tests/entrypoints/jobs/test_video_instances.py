"""Two ``diffserve serve`` instances of the tiny Wan sharing one PostgreSQL job store (a
real server, tests/pg_server.py) and one artifact directory: a job created on one is
listed, retrieved, downloaded and deleted on the other; only the instance that runs a
job (its lease holder) marks it; when that instance is SIGKILLed, the survivor takes the
job over once the lease expires (here: runs it again, --requeue-interrupted), never both
at once; and a store that goes away mid-job fails no server: requests get a 5xx
meanwhile, and the job runs again once the store is back."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pg_server import postgres_bin, postgres_server
from server_process import ServerProcess
from video_requests import SHORT

DEPLOY = """
dtype: float32
enforce_eager: true
warmup:
  enabled: false
server:
  max_steps: 100000
  job_lease_s: 3
  requeue_interrupted: true
"""


@pytest.fixture(scope="module")
def store_url() -> Iterator[str]:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed here (make postgres installs it)")
    import psycopg

    with postgres_server() as base:
        with psycopg.connect(_libpq(base) + "/postgres", autocommit=True) as admin:
            admin.execute("CREATE DATABASE videos")
        yield base + "/videos"


def start(tmp: Path, model: Path, store_url: str, name: str) -> ServerProcess:
    (tmp / "deploy.yaml").write_text(DEPLOY)
    server = ServerProcess(
        [
            str(model),
            "--deploy-config",
            str(tmp / "deploy.yaml"),
            "--state-dir",
            str(tmp / name),
            "--job-store",
            store_url,
            "--artifact-dir",
            str(tmp / "shared"),
            "--served-model-name",
            "tiny-wan",
        ],
        tmp / f"{name}.log",
    )
    return server


def video(server: ServerProcess, video_id: str) -> dict:
    return httpx.get(f"{server.url}/v1/videos/{video_id}", timeout=30).json()


def wait(
    server: ServerProcess, video_id: str, done: tuple[str, ...], timeout: float = 120
) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = video(server, video_id)
        if seen.get("status") in done:
            return seen
        time.sleep(0.05)
    raise TimeoutError(f"{video_id}: {seen}")


def test_two_instances_share_jobs_and_take_over_a_dead_ones(
    tmp_path: Path, tiny_wan_dir: Path, store_url: str
) -> None:
    first = start(tmp_path, tiny_wan_dir, store_url, "a")
    second = start(tmp_path, tiny_wan_dir, store_url, "b")
    servers = {}
    try:
        first.wait_for("/ready")
        second.wait_for("/ready")
        names = {}
        for server in (first, second):
            made = httpx.post(server.url + "/v1/videos", json=SHORT, timeout=30).json()
            names[made["id"]] = server
        for job_id in names:  # each is visible, downloadable and the same on both
            on_first, on_second = (
                wait(first, job_id, ("completed",)),
                wait(second, job_id, ("completed",)),
            )
            assert on_first == on_second and on_first["diffserve"]["instance"].endswith(
                (f":{first.port}", f":{second.port}")
            )
            assert (
                httpx.get(f"{first.url}/v1/videos/{job_id}/content", timeout=30).content
                == httpx.get(
                    f"{second.url}/v1/videos/{job_id}/content", timeout=30
                ).content
            )
        listed = httpx.get(second.url + "/v1/videos?order=asc", timeout=30).json()
        assert set(names) <= {v["id"] for v in listed["data"]}
        gone = next(iter(names))
        assert (
            httpx.delete(f"{second.url}/v1/videos/{gone}", timeout=30).json()["deleted"]
            is True
        )
        assert httpx.get(f"{first.url}/v1/videos/{gone}", timeout=30).status_code == 404
        assert not list((tmp_path / "shared").glob(f"{gone}*"))

        # A long job: whichever instance claims it is its only runner; kill that one
        # mid-run.
        long = httpx.post(
            first.url + "/v1/videos",
            json={**SHORT, "num_inference_steps": 60},
            timeout=30,
        ).json()
        running = wait(first, long["id"], ("in_progress",))
        servers = {f"{first.port}": first, f"{second.port}": second}
        holder_port = running["diffserve"]["instance"].rsplit(":", 1)[1]
        holder = servers.pop(holder_port)
        (survivor,) = servers.values()
        assert (
            video(survivor, long["id"])["diffserve"]["instance"]
            == running["diffserve"]["instance"]
        )
        holder.kill()
        done = wait(survivor, long["id"], ("completed", "failed"), timeout=180)
        assert done["status"] == "completed", done
        # Ran again, by the survivor.
        assert done["diffserve"]["instance"].endswith(f":{survivor.port}")
        assert (
            httpx.get(
                f"{survivor.url}/v1/videos/{long['id']}/content", timeout=30
            ).status_code
            == 200
        )

        # The store goes away mid-job: requests get an OpenAI-shaped 5xx, the server
        # lives, the job is not lost.
        cut = httpx.post(
            survivor.url + "/v1/videos",
            json={**SHORT, "num_inference_steps": 30},
            timeout=30,
        ).json()
        wait(survivor, cut["id"], ("in_progress",))
        with _store_blocked(store_url):
            time.sleep(4)
            outage = httpx.get(f"{survivor.url}/v1/videos/{cut['id']}", timeout=30)
            assert (
                outage.status_code == 500
                and outage.json()["error"]["code"] == "internal_error"
            )
            assert httpx.get(survivor.url + "/health", timeout=10).status_code == 200
        assert (
            wait(survivor, cut["id"], ("completed", "failed"), timeout=180)["status"]
            == "completed"
        )
    finally:
        first.stop()
        second.stop()


@contextlib.contextmanager
def _store_blocked(store_url: str) -> Iterator[None]:
    """No new connection to the store's database, and every open one (the servers'
    pools) cut."""
    import psycopg

    with psycopg.connect(
        _libpq(store_url).rsplit("/", 1)[0] + "/postgres", autocommit=True
    ) as admin:
        admin.execute("ALTER DATABASE videos ALLOW_CONNECTIONS false")
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = 'videos'"
        )
        try:
            yield
        finally:
            admin.execute("ALTER DATABASE videos ALLOW_CONNECTIONS true")


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg", "postgresql")
