"""One batch on one replica: execute it (with step-level joins), deliver each request's
final item and the batch's stats, and say how it ended (``Outcome``) for the
consecutive-failure streak.

A failed batch of several requests is rerun one request at a time, so one bad request
fails alone. A lost replica (dead or hung worker) fails the batch's requests; the engine
core decides what that means for the engine (``EngineCore.replica_lost``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from diffserve.engine.outcome import Outcome
from diffserve.engine.outputs import build_output, with_ar
from diffserve.engine.stage_loop import stage_entry
from diffserve.engine.stats import BatchStats, kernel_delta
from diffserve.engine.step_joins import StepJoins
from diffserve.engine.step_watch import StepWatch
from diffserve.engine.watchdog import batch_deadline_s, work_units
from diffserve.errors import (
    EngineDeadError,
    RequestAbortedError,
    RequestError,
    WorkerError,
)
from diffserve.executor.base import DeadlineExceeded
from diffserve.logging import get_logger
from diffserve.tracing.spans import current
from diffserve.types.modality import IMAGE, Modality
from diffserve.types.request import ProgressEvent
from diffserve.types.results import RequestResult

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.config.schema import StageConfig
    from diffserve.engine.decode_stage import DecodeStage
    from diffserve.engine.replicas import Replica, ReplicaSet
    from diffserve.engine.scheduler import FinalItem, RequestState, Scheduler
    from diffserve.engine.stats import EngineCounters

logger = get_logger(__name__)

# A request and its final item: a RequestOutput or an exception.
Final = tuple["RequestState", "FinalItem"]


class BatchHost(Protocol):
    """What a batch run needs from its engine (``EngineCore``): the deployment, the
    queue and replicas, the counters, and where final items, stats and lost replicas
    go."""

    config: ResolvedConfig
    stage: StageConfig
    scheduler: Scheduler
    replicas: ReplicaSet
    counters: EngineCounters
    decode: DecodeStage | None  # encode_denoise_decode: where finished latents go

    def deliver(self, finals: list[Final]) -> None: ...

    def publish(self, stats: BatchStats) -> None: ...

    def replica_hung(
        self,
        replica: Replica,
        live: list[RequestState],
        deadline: float,
        stalled: str | None = None,
    ) -> None: ...

    def replica_lost(
        self, replica: Replica, live: list[RequestState], error: EngineDeadError
    ) -> None: ...


class BatchRun:
    """The requests of one batch that are still live, run once on ``replica``."""

    def __init__(
        self, core: BatchHost, replica: Replica, batch: list[RequestState]
    ) -> None:
        self.core = core
        self.replica = replica
        self.live = [s for s in batch if not s.aborted and not s.finished]
        self.start = time.monotonic()
        # Kernel counts in an attestation are cumulative over a step-level run: what
        # earlier groups of finished requests already reported (only the difference is
        # reported again).
        self.counted: dict[str, Any] = {}
        self.watch: StepWatch | None = None

    def run(self) -> tuple[Outcome, BaseException | None]:
        if not self.live:
            return Outcome.EMPTY, None
        core, live = self.core, self.live
        requests = [s.request for s in live]
        executor = self.replica.executor
        deadline = batch_deadline_s(requests, core.config.server)
        # Decided once for the stage (``policy.joins_steps``: batching, max_batch_size,
        # the replicas' capabilities), so joins and the scheduler's lanes agree.
        step_level = core.scheduler.step_level
        joins = (
            StepJoins(
                self.replica, core.replicas, core.scheduler, core.config.server, live
            )
            if step_level
            else None
        )
        self.watch = StepWatch(
            self.replica.pace,
            lambda: work_units([s.request for s in live if not s.finished]),
            compiled=not core.stage.enforce_eager,
        )
        try:
            outputs = executor.execute(
                requests,
                self._on_step,
                should_cancel=lambda: all(s.aborted for s in live if not s.finished),
                timeout=deadline,
                joiner=joins,
                on_partial=self._on_partial if step_level else None,
                stalled=self.watch.stalled,
            )
            self.watch.finished()
        except RequestAbortedError:
            # Stats first, then the final items: whoever sees a result also sees its
            # batch counted.
            self._emit(live, Outcome.ABORTED, None)
            core.deliver(
                [
                    (s, RequestAbortedError(f"request {s.request_id} was aborted"))
                    for s in live
                    if not s.finished
                ]
            )
            return Outcome.ABORTED, None
        except DeadlineExceeded:
            core.replica_hung(self.replica, live, deadline, self.watch.reason)
            return Outcome.DEAD, None
        except EngineDeadError as exc:
            core.replica_lost(self.replica, live, exc)
            return Outcome.DEAD, exc
        except Exception as exc:
            return self._failed(exc)
        if joins is not None:
            joins.late(
                {o.request_id for o in outputs}
                | {s.request_id for s in live if s.finished}
            )
        finals = self._finals(outputs, last=True)
        if finals or not step_level:
            self._emit(
                [s for s, _ in finals] if step_level else live,
                Outcome.OK,
                outputs[0] if outputs else None,
                self.counted if step_level else None,
            )
        self._deliver_ok(finals)
        return Outcome.OK, None

    def _on_step(
        self, step: int, total: int, progress: tuple = (), previews: tuple = ()
    ) -> None:
        if self.watch is not None:
            self.watch.stepped(step, total)
        steps = dict(progress)
        for state in list(self.live):
            # A request sent to join is not in the worker's progress until its first
            # step.
            if not state.finished and (not steps or state.request_id in steps):
                state.steps_done = steps.get(state.request_id, step)
                # A step-level batch mixes step counts: each request's own total.
                own = state.request.num_inference_steps if steps else None
                event = ProgressEvent(state.request_id, state.steps_done, own or total)
                state.sink(event)
                for preview in previews:
                    if preview.request_id == state.request_id:
                        state.sink(
                            replace(
                                event,
                                preview=preview.images,
                                preview_index=preview.index,
                            )
                        )

    def _on_partial(self, outputs: list[RequestResult]) -> None:
        # Requests that finished together: their stats first, then their results (as for
        # a batch).
        finals = self._finals(outputs)
        self._emit(
            [s for s, _ in finals],
            Outcome.OK,
            outputs[0] if outputs else None,
            self.counted,
        )
        self._deliver_ok(finals)

    def _failed(self, exc: Exception) -> tuple[Outcome, BaseException | None]:
        live = self.live
        live[:] = [s for s in live if not s.finished]
        if len(live) > 1:
            # Isolate the failure: rerun each request alone so one bad request fails
            # alone. The reruns make one batch for the failure streak: it failed unless
            # one of them succeeded.
            logger.warning(
                "batch of %d failed (%s); retrying its requests one by one",
                len(live),
                exc,
            )
            outcomes = []
            for state in live:
                # The rerun's lines name its own request's trace.
                with current([state.request]):
                    outcomes.append(BatchRun(self.core, self.replica, [state]).run())
            if any(kind is Outcome.OK for kind, _ in outcomes):
                return Outcome.OK, None
            if any(kind is Outcome.DEAD for kind, _ in outcomes):
                return Outcome.DEAD, None
            errors = [error for kind, error in outcomes if kind is Outcome.ERROR]
            return (Outcome.ERROR, errors[-1]) if errors else (Outcome.REJECTED, None)
        self._emit(live, Outcome.ERROR, None)
        self.core.counters.requests_failed += int(not live[0].finished)
        self.core.deliver([(live[0], exc)])
        # A request the model refuses is the client's fault, not a sign of a sick
        # engine.
        return (
            Outcome.REJECTED if isinstance(exc, RequestError) else Outcome.ERROR
        ), exc

    def _finals(
        self, outputs: list[RequestResult], *, last: bool = False
    ) -> list[Final]:
        """The final items of the requests in ``outputs`` (a step-level batch has them
        as requests finish); on the ``last`` call a live request without an output
        fails."""
        by_id = {o.request_id: o for o in outputs}
        finals: list[Final] = []
        for state in list(self.live):
            if state.finished:
                continue
            output = by_id.get(state.request_id)
            if output is None:
                if last:
                    finals.append(
                        (
                            state,
                            WorkerError(
                                f"the worker returned no output for {state.request_id}"
                            ),
                        )
                    )
                continue
            queue_ms = ((state.started or self.start) - state.arrival) * 1000.0
            # Encode_denoise_decode.
            if output.handoff is not None and self.core.decode is not None:
                self.core.decode.take(state, output, queue_ms)
                continue
            final = build_output(state.request, output, queue_ms, self._modality())
            if state.stages:  # a staged topology: each stage's entry, this one last
                final.attestation.update(state.carried)  # type: ignore[typeddict-item]
                final.attestation["stages"] = [
                    *state.stages,
                    stage_entry(self.core.stage, dict(final.attestation)),
                ]
                final.timings.update(
                    {k: round(float(v), 3) for k, v in state.stage_timings_ms.items()}
                )
            finals.append(
                (
                    state,
                    with_ar(
                        final,
                        state.original_prompt,
                        state.revised_prompt,
                        state.ar,
                        state.stage_timings_ms,
                    ),
                )
            )
        return finals

    def _modality(self) -> Modality:
        capabilities = self.replica.executor.capabilities
        return capabilities.modality if capabilities is not None else IMAGE

    def _deliver_ok(self, finals: list[Final]) -> None:
        self.core.counters.requests_ok += sum(
            1
            for s, item in finals
            if not s.finished and not isinstance(item, BaseException)
        )
        self.core.deliver(finals)

    def _emit(
        self,
        states: list[RequestState],
        outcome: Outcome,
        first: RequestResult | None,
        counted: dict[str, Any] | None = None,
    ) -> None:
        """Stats of the batch (or of the requests of a step-level batch that finished
        together)."""
        kernels = (
            {
                k: first.attestation.get(k)
                for k in ("linear", "attention", "transformer_forwards")
            }
            if first is not None
            else {}
        )
        if counted is not None and kernels:
            kernels, counted_now = kernel_delta(kernels, counted), kernels
            counted.clear()
            counted.update(counted_now)
        self.core.publish(
            BatchStats(
                executor=self.replica.executor.name,
                replica=self.replica.index,
                batch_size=len(states),
                images=sum(s.request.n for s in states),
                request_ids=tuple(s.request_id for s in states),
                queue_ms=tuple(
                    round(((s.started or self.start) - s.arrival) * 1000.0, 3)
                    for s in states
                ),
                batch_ms=round((time.monotonic() - self.start) * 1000.0, 3),
                outcome=outcome,
                phase_ms=dict(first.timings_ms) if first is not None else {},
                kernels=kernels,
            )
        )
