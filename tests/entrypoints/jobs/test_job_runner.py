"""The video job runner's engine slots, in process (a real SQLite store, a stub engine
that never finishes): a job deleted right after this instance claimed it, before its
task ever ran, frees the model's slot, so the next queued job runs (it used to stay
taken: every later job of that model stayed ``queued`` until a restart)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from diffserve.entrypoints.jobs.artifacts import ArtifactDir
from diffserve.entrypoints.jobs.job_request import to_row
from diffserve.entrypoints.jobs.runner import JobRunner, RunnerSettings
from diffserve.entrypoints.jobs.store import JobStore
from diffserve.types.request import GenerationRequest


class StuckEngine:
    """One replica whose requests run until aborted."""

    num_replicas = 1
    is_ready = True

    def __init__(self) -> None:
        self.started: list[str] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Any]:
        self.started.append(request.request_id)
        await asyncio.Event().wait()
        yield None

    async def abort(self, request_id: str) -> None:
        pass


class Host:
    def __init__(self, engine: StuckEngine) -> None:
        self.engine = engine
        self.is_ready = True

    def require(self) -> StuckEngine:
        return self.engine


def test_a_job_deleted_before_its_task_ran_frees_the_slot(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.sqlite3'}")
    engine = StuckEngine()
    runner = JobRunner(
        store,
        ArtifactDir(tmp_path / "videos"),
        {"m": Host(engine)},
        RunnerSettings(owner="here", lease_s=30, deadline_s=60, ttl_s=0, requeue=False),
    )
    row = to_row(
        GenerationRequest(prompt="a ball", request_id="r", num_frames=5),
        seconds="1",
        has_input=False,
    )

    def create(now: float) -> str:
        return store.create(model="m", prompt="a ball", request=row, now=now)[0].id

    async def scenario() -> None:
        first = create(time.time())
        # Claims the first job: its task exists, it has not run a line yet.
        await runner._claim()
        assert list(runner._running) == [first]
        assert await runner.cancel(first)  # DELETE's call, before the task's first step
        store.delete(first)
        second = create(time.time() + 1)
        await runner._claim()
        # The slot was free again.
        assert list(runner._running) == [second], runner._running
        await asyncio.sleep(0.05)
        assert [request_id.rsplit("-", 1)[0] for request_id in engine.started] == [
            second
        ]
        # Aborts the second and hands it back (failed, as at a restart)
        await runner.stop()

    try:
        asyncio.run(scenario())
    finally:
        store.close()
