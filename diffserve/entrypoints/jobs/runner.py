"""Runs this instance's share of the video jobs: claims queued jobs of the models it
serves (a lease in the store, so two instances never run one job), runs each on the
engine, publishes its files, then marks the row.

Order of effects, so that a crash anywhere leaves a consistent store
(docs/api.md#videos):
- ``in_progress`` is written at the first denoise step, by the lease holder only;
- a heartbeat advances the lease and records progress; a heartbeat that finds the lease
  gone (the job was
  deleted, or another instance took it after this one stalled) aborts the engine
  request;
- the MP4, thumbnail and sprite sheet are published (temporary file + rename) before the
  row says
  ``completed``; a row that cannot be completed takes its files with it;
- every failure (the engine's, the encoder's, the disk's, the store's, the deadline)
  fails the job with a code,
  never the server. At start, this instance's own unfinished jobs (a crash) are failed
  or requeued, and a periodic sweep does the same for jobs whose holder's lease expired
  (a dead instance), deletes expired jobs (row first, then files) and files without a
  row.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diffserve.entrypoints.api_errors import to_api_error
from diffserve.entrypoints.engine_host import EngineHost
from diffserve.entrypoints.jobs.artifacts import ArtifactDir
from diffserve.entrypoints.jobs.job_request import from_row
from diffserve.entrypoints.jobs.outputs import ArtifactWriteError, publish, read_input
from diffserve.entrypoints.jobs.store import Job, JobStore
from diffserve.entrypoints.jobs.wakeup import wait_awake
from diffserve.logging import get_logger
from diffserve.provenance.keys import Signer
from diffserve.tracing.attributes import MODEL, REQUEST_ID, VIDEO_JOB
from diffserve.tracing.spans import span
from diffserve.types.request import ProgressEvent, RequestOutput

logger = get_logger(__name__)

# progress at the last denoise step; decoding and encoding the files take it to 100
DENOISE_SHARE = 90
SWEEP_EVERY_S = 5.0


class LeaseLost(Exception):
    """The job's row is gone or another instance holds it: stop, publish nothing."""


@dataclass(frozen=True)
class RunnerSettings:
    # This instance's name in the store's leases (stable across its restarts)
    owner: str
    lease_s: float
    deadline_s: float
    ttl_s: float  # 0: finished jobs are kept
    requeue: bool
    poll_s: float = 0.5
    # The key every finished MP4's provenance manifest is signed with (None: unsigned).
    signer: Signer | None = None


class JobRunner:
    def __init__(
        self,
        store: JobStore,
        artifacts: ArtifactDir,
        hosts: Mapping[str, EngineHost],
        settings: RunnerSettings,
    ) -> None:
        """``hosts``: the engine of each model (by the id jobs are stored under) whose
        jobs this instance runs."""
        self.store = store
        self.artifacts = artifacts
        self.hosts = dict(hosts)
        self.settings = settings
        self._running: dict[str, asyncio.Task[None]] = {}
        self._models: dict[str, str] = {}  # running job id -> its model
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._last_sweep = 0.0

    # -- life
    # ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover this instance's interrupted jobs, then claim and run jobs in the
        background."""
        recovered = await asyncio.to_thread(
            self.store.recover,
            now=time.time(),
            requeue=self.settings.requeue,
            owner=self.settings.owner,
            expires_at=self._expiry(),
        )
        for job_id in recovered:  # whatever a crash left half-written
            await asyncio.to_thread(self.artifacts.remove, job_id)
        if recovered:
            logger.warning(
                "%s %d job(s) interrupted by this instance's restart: %s",
                "requeued" if self.settings.requeue else "failed",
                len(recovered),
                ", ".join(recovered),
            )
        self._loop_task = asyncio.create_task(self._loop(), name="diffserve-video-jobs")

    async def stop(self) -> None:
        """Stop claiming; abort running jobs and hand them back (failed or requeued, as
        at a restart)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(
                self.store.recover,
                now=time.time(),
                requeue=self.settings.requeue,
                owner=self.settings.owner,
                expires_at=self._expiry(),
            )
        await asyncio.to_thread(self.store.close)

    def notify(self) -> None:
        """A job was created here: look for work now instead of at the next poll."""
        self._wake.set()

    async def cancel(self, job_id: str) -> bool:
        """Abort a job running here (DELETE): its engine request stops at the next step.
        False if not here."""
        task = self._running.get(job_id)
        if task is None:
            return False
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return True

    # -- claiming
    # ----------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await wait_awake(self._wake, self.settings.poll_s)
            try:
                if time.monotonic() - self._last_sweep >= SWEEP_EVERY_S:
                    self._last_sweep = time.monotonic()
                    await self._sweep()
                await self._claim()
            except Exception as exc:  # noqa: BLE001 - a store outage must not end the loop; it retries
                logger.error("video job loop: %s: %s", type(exc).__name__, exc)

    async def _claim(self) -> None:
        for model, host in self.hosts.items():
            engine = host.engine
            if engine is not None and host.is_ready:
                running = sum(
                    1 for job_model in self._models.values() if job_model == model
                )
                await self._claim_for(model, max(1, engine.num_replicas) - running)

    async def _claim_for(self, model: str, free: int) -> None:
        """Claim up to ``free`` queued jobs of ``model`` (one per free replica) and
        start them."""
        if free <= 0:
            return
        now = time.time()
        for job in await asyncio.to_thread(
            self.store.claimable, now=now, limit=free * 4, models=(model,)
        ):
            if free <= 0:
                break
            won = await asyncio.to_thread(
                self.store.claim,
                job.id,
                self.settings.owner,
                now=time.time(),
                lease_s=self.settings.lease_s,
            )
            if won:
                free -= 1
                self._models[job.id] = model
                task = asyncio.create_task(self._run(job), name=f"diffserve-{job.id}")
                self._running[job.id] = task
                # _run's finally frees the slot; a task cancelled before it ever ran (a
                # DELETE right after the claim) runs no finally, so this does, else the
                # model's slot stays taken and its queue stalls.
                task.add_done_callback(functools.partial(self._forget, job.id))

    def _forget(self, job_id: str, task: asyncio.Task[None]) -> None:
        if self._running.get(job_id) is task:
            del self._running[job_id]
            self._models.pop(job_id, None)
            self._wake.set()

    async def _sweep(self) -> None:
        now = time.time()
        taken_over = await asyncio.to_thread(
            self.store.recover,
            now=now,
            requeue=self.settings.requeue,
            expires_at=self._expiry(),
        )
        for job_id in taken_over:
            await asyncio.to_thread(self.artifacts.remove, job_id)
            logger.warning(
                "job %s: its instance stopped renewing the lease; %s",
                job_id,
                "requeued" if self.settings.requeue else "failed",
            )
        for job_id in await asyncio.to_thread(self.store.expired, now):
            # Row first: from this moment the job is 404 everywhere, then its files go.
            await asyncio.to_thread(self.store.delete, job_id)
            await asyncio.to_thread(self.artifacts.remove, job_id)
        on_disk = await asyncio.to_thread(self.artifacts.outputs)
        known = await asyncio.to_thread(self.store.existing, on_disk)
        # A delete or an expiry interrupted between row and files.
        for job_id in set(on_disk) - known:
            await asyncio.to_thread(self.artifacts.remove, job_id)

    # -- running one job
    # ----------------------------------------------------------------------------

    async def _run(self, job: Job) -> None:
        progress = [0]
        request_id = f"{job.id}-{int(time.time() * 1000)}"
        heartbeat = asyncio.create_task(
            self._heartbeat(job.id, progress, asyncio.current_task())
        )
        try:
            # One trace per job run (its POST's HTTP span has the job id too): the
            # engine's and workers' spans and the MP4 encode join it.
            with span(
                "diffserve.video_job",
                {VIDEO_JOB: job.id, MODEL: job.model, REQUEST_ID: request_id},
            ):
                async with asyncio.timeout(self.settings.deadline_s):
                    output = await self._generate(job, request_id, progress)
                    progress[0] = DENOISE_SHARE + 5
                    result = await asyncio.to_thread(
                        publish,
                        self.artifacts,
                        job,
                        output,
                        self.settings.owner,
                        self.settings.signer,
                    )
            heartbeat.cancel()
            done = await asyncio.to_thread(
                self.store.complete,
                job.id,
                self.settings.owner,
                now=time.time(),
                result=result,
                expires_at=self._expiry(),
            )
            if not done:
                raise LeaseLost(job.id)
            logger.info("video job %s completed", job.id)
        except ArtifactWriteError as exc:
            await self._end(job, request_id, "artifact_write_failed", str(exc))
        except TimeoutError:
            await self._end(
                job,
                request_id,
                "deadline_exceeded",
                "the job took longer "
                f"than server.job_deadline_s={self.settings.deadline_s:g} "
                "s",
            )
        except (LeaseLost, asyncio.CancelledError):
            # Deleted (here or on another instance), taken over, or this server is
            # stopping: nothing of it stays.
            await self._abort(job, request_id)
            await asyncio.to_thread(self.artifacts.remove, job.id)
        except Exception as exc:  # noqa: BLE001 - the engine's, the encoder's, the disk's or the store's failure
            error = to_api_error(exc, request_id)
            await self._end(
                job, request_id, error.code or "internal_error", error.message
            )
        finally:
            heartbeat.cancel()
            self._running.pop(job.id, None)
            self._models.pop(job.id, None)
            self._wake.set()  # a slot is free

    async def _generate(
        self, job: Job, request_id: str, progress: list[int]
    ) -> RequestOutput:
        engine = self.hosts[job.model].require()
        image = None
        if job.request.get("has_input"):
            image = await asyncio.to_thread(read_input, self.artifacts, job.id)
        started = False
        async for event in engine.generate(from_row(job.request, request_id, image)):
            if isinstance(event, ProgressEvent):
                if not started:
                    started = await asyncio.to_thread(
                        self.store.start,
                        job.id,
                        self.settings.owner,
                        now=time.time(),
                        lease_s=self.settings.lease_s,
                    )
                    if not started:
                        raise LeaseLost(job.id)
                progress[0] = event.step * DENOISE_SHARE // max(1, event.total_steps)
            elif isinstance(event, RequestOutput):
                return event
        raise RuntimeError(f"the engine ended job {job.id} without an output")

    async def _heartbeat(
        self, job_id: str, progress: list[int], work: asyncio.Task[Any] | None
    ) -> None:
        """Renew the lease and record progress; a lost lease (deleted, taken over)
        cancels the work."""
        period = min(1.0, self.settings.lease_s / 4)
        while True:
            await asyncio.sleep(period)
            try:
                held = await asyncio.to_thread(
                    self.store.heartbeat,
                    job_id,
                    self.settings.owner,
                    now=time.time(),
                    lease_s=self.settings.lease_s,
                    progress=progress[0],
                )
            except Exception as exc:  # noqa: BLE001 - a store hiccup: the lease outlives a few missed beats
                logger.warning(
                    "job %s: heartbeat failed: %s: %s", job_id, type(exc).__name__, exc
                )
                continue
            if not held:
                logger.info(
                    "job %s: lease gone (deleted or taken over); aborting it", job_id
                )
                if work is not None:
                    work.cancel()
                return

    async def _end(self, job: Job, request_id: str, code: str, message: str) -> None:
        logger.warning("video job %s failed (%s): %s", job.id, code, message)
        await self._abort(job, request_id)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.artifacts.remove, job.id)
        try:
            await asyncio.to_thread(
                self.store.fail,
                job.id,
                code,
                message,
                now=time.time(),
                owner=self.settings.owner,
                expires_at=self._expiry(),
            )
        except Exception as exc:  # noqa: BLE001 - the lease expires and the sweep fails it then
            logger.error(
                "job %s: could not record its failure: %s: %s",
                job.id,
                type(exc).__name__,
                exc,
            )

    async def _abort(self, job: Job, request_id: str) -> None:
        host = self.hosts.get(job.model)
        engine = host.engine if host is not None else None
        if engine is not None:
            with contextlib.suppress(Exception):
                await engine.abort(request_id)

    def _expiry(self) -> float | None:
        return time.time() + self.settings.ttl_s if self.settings.ttl_s > 0 else None
