"""A stage of a staged topology besides the denoising one: its own replicas (executor,
devices, dtype, kernels), its own queue and one dispatch loop per replica
(``EncodeStage`` in front of the denoiser, ``DecodeStage`` behind it). What a stage does
with its outputs is the subclass's ``_hand_on``.

A batch past ``server.batch_deadline_floor_s`` means a hung worker: its replica is taken
out; with no replica left the engine is dead and the error names the stage. A batch that
fails fails its requests, named by stage.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Protocol

from diffserve.engine.replicas import Replica, ReplicaSet
from diffserve.engine.scheduler import RequestState, Scheduler
from diffserve.errors import EngineDeadError, WorkerError
from diffserve.executor.base import DeadlineExceeded
from diffserve.logging import get_logger
from diffserve.tracing.spans import current
from diffserve.types.results import RequestResult

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.config.schema import StageConfig
    from diffserve.engine.stats import EngineCounters

logger = get_logger(__name__)

# What a stage entry of the attestation copies from that stage worker's own attestation.
STAGE_KEYS = (
    "executor",
    "replica",
    "worker_pid",
    "node",
    "device",
    "dtype",
    "linear",
    "attention",
    "batch_size",
    "batch_ms",
    "quantization",
)


def stage_entry(stage: StageConfig, attestation: dict[str, Any]) -> dict[str, Any]:
    """One ``attestation["stages"]`` entry: the stage's id and role, and where and how
    it ran."""
    return {
        "stage_id": stage.stage_id,
        "role": stage.role,
        **{key: attestation[key] for key in STAGE_KEYS if key in attestation},
    }


class StageHost(Protocol):
    """What a stage needs from its engine (``EngineCore``): the denoising stage and its
    queue, the counters, the stop signal, where final items go and where a stage's death
    goes."""

    config: ResolvedConfig
    stage: StageConfig
    scheduler: Scheduler
    counters: EngineCounters

    @property
    def stopping(self) -> threading.Event: ...

    @property
    def is_shut_down(self) -> bool: ...

    def die(self, error: EngineDeadError) -> None: ...

    def deliver(self, finals: list[tuple[RequestState, Any]]) -> None: ...


class QueuedStage:
    """A stage with a queue of its own (``scheduler``): what the engine aborts in it and
    fails when it dies."""

    scheduler: Scheduler

    def abort(self, request_id: str) -> tuple[RequestState | None, bool]:
        return self.scheduler.abort(request_id)

    def fail_waiting(self, reason: str) -> None:
        """Close this stage's queue and fail what waits in it (or runs in it) with
        ``reason``."""
        for state in self.scheduler.drain():
            state.finish(EngineDeadError(reason))


class StageLoop(QueuedStage):
    def __init__(
        self, core: StageHost, config: ResolvedConfig, stage: StageConfig
    ) -> None:
        self.core = core
        self.config = config
        self.stage = stage
        self.scheduler = Scheduler(stage.max_batch_size, config.server.max_queue)
        self.replicas = ReplicaSet(config, stage)
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        """Build (and warm) the stage's replicas, then start one dispatch loop per
        replica."""
        self.replicas.start(on_dead=self._take_out)
        for replica in self.replicas.replicas:
            thread = threading.Thread(
                target=self._loop,
                args=(replica,),
                daemon=True,
                name=f"diffserve-stage{self.stage.stage_id}-replica-{replica.index}",
            )
            thread.start()
            self.threads.append(thread)

    def describe(self) -> str:
        return f"stage {self.stage.stage_id} ({self.stage.role})"

    def _loop(self, replica: Replica) -> None:
        while not self.core.stopping.is_set():
            if not replica.live:
                self.core.stopping.wait(0.5)
                continue
            batch = self.scheduler.next_batch(timeout=0.5, replica=replica.index)
            if not batch:
                continue
            live = [s for s in batch if not s.aborted and not s.finished]
            # Tracing on: what this thread logs about the batch names its (first)
            # request's trace.
            with current([s.request for s in batch]):
                try:
                    if live:
                        logger.debug(
                            "%s runs batch %s on replica %d",
                            self.describe(),
                            [s.request_id for s in live],
                            replica.index,
                        )
                        outputs = replica.executor.execute(
                            [s.request for s in live],
                            timeout=float(self.config.server.batch_deadline_floor_s),
                        )
                        self._hand_on(
                            [s for s in live if not s.aborted and not s.finished],
                            outputs,
                        )
                except Exception as exc:  # noqa: BLE001 - every error fails this batch's requests, named by stage
                    self._fail(replica, live, exc)
                finally:
                    self.scheduler.done(batch)

    def _hand_on(self, live: list[RequestState], outputs: list[RequestResult]) -> None:
        raise NotImplementedError

    def _output_of(
        self, state: RequestState, by_id: dict[str, RequestResult]
    ) -> RequestResult | None:
        """The worker's output for ``state`` (its request fails, named by stage, when
        there is none)."""
        output = by_id.get(state.request_id)
        if output is None:
            self.core.counters.requests_failed += 1
            state.finish(
                WorkerError(
                    f"{self.describe()} returned no output for {state.request_id}"
                )
            )
        return output

    def _fail(self, replica: Replica, live: list[RequestState], exc: Exception) -> None:
        if isinstance(exc, DeadlineExceeded):
            error = EngineDeadError(
                f"{self.describe()}: a batch exceeded its deadline; "
                f"replica {replica.index} "
                "is hung"
            )
            replica.executor.abandon(str(error))
            self._take_out(replica, error)
            exc = error
        else:
            logger.error("%s failed a batch: %s", self.describe(), exc)
        self.core.counters.requests_failed += sum(1 for s in live if not s.finished)
        for state in live:
            state.finish(
                exc
                if isinstance(exc, EngineDeadError | WorkerError)
                else WorkerError(f"{self.describe()}: {exc}")
            )

    def _take_out(self, replica: Replica, error: EngineDeadError) -> None:
        if self.core.is_shut_down:
            return
        remaining = self.replicas.take_out(replica, error)
        if remaining == 0:
            self.core.die(
                EngineDeadError(f"{self.describe()} has no live replica: {error}")
            )

    def shutdown(self, reason: str) -> None:
        self.fail_waiting(reason)
        self.replicas.shutdown()
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10.0)
