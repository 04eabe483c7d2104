"""The engine core: admission, the background loop that runs batches on the
executor, progress and result delivery, abort, warmup and death handling.

``Engine`` and ``AsyncEngine`` are thin front ends over this one loop, so both have the same
semantics. Every request gets exactly one final item through its sink: a ``RequestOutput`` or an
exception (``RequestAbortedError``, ``EngineDeadError``, ``WorkerError``, ``RequestError``).

Liveness (``watchdog.py``): every batch runs under a deadline derived from its work; a batch past it
means a hung worker, and the engine dies (mp: the worker processes are SIGKILLed). The loop beats a
heartbeat while idle and at every batch start and end. ``server.max_consecutive_failures`` failed
batches in a row also kill the engine, so ``/health`` turns 503 instead of answering 500 forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from diffserve.engine.admission import admit, check_capabilities
from diffserve.engine.outputs import build_output
from diffserve.engine.scheduler import RequestState, Scheduler, Sink
from diffserve.engine.stats import BatchStats, EngineCounters
from diffserve.engine.watchdog import FailureStreak, Heartbeat, batch_deadline_s
from diffserve.errors import (
    EngineDeadError,
    EngineNotReadyError,
    RequestAbortedError,
    RequestError,
    WorkerError,
)
from diffserve.executor.base import DeadlineExceeded, Executor
from diffserve.executor.factory import make_executor
from diffserve.logging import get_logger
from diffserve.types.request import GenerationRequest, ProgressEvent
from diffserve.types.results import RequestResult

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import ResolvedConfig

logger = get_logger(__name__)


class EngineCore:
    """Owns the executor, the scheduler and the loop thread of one engine."""

    def __init__(self, config: ResolvedConfig, executor: Executor | None = None) -> None:
        self.config = config
        self.stage = config.stage_for_role("diffusion")
        self.scheduler = Scheduler(self.stage.max_batch_size, config.server.max_queue)
        self.counters = EngineCounters()
        self._listeners: list[Callable[[BatchStats], None]] = []
        self._dead: EngineDeadError | None = None
        self._ready = False
        self._stopping = threading.Event()
        self._shutdown_lock = threading.Lock()
        self._is_shutdown = False
        self._heartbeat = Heartbeat()
        self._failures = FailureStreak(config.server.max_consecutive_failures)
        self.executor = executor or make_executor(config, self.stage.stage_id)
        self.executor.on_dead = self._on_worker_death
        try:
            if self.stage.warmup.enabled and config.model:
                self._warmup()
        except BaseException:
            self.executor.shutdown()
            raise
        self._thread = threading.Thread(target=self._loop, name="diffserve-engine-core", daemon=True)
        self._thread.start()
        self._ready = True

    # -- admission ----------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, sink: Sink) -> RequestState:
        """Admit (limits, model capabilities, seed: ``admission.py``) and queue. Raises instead of
        queueing a request that cannot run."""
        self.check_health()
        if not self._ready:
            raise EngineNotReadyError("the engine is still loading or warming up")
        state = RequestState(admit(request, self.config.server, self.executor.capabilities), sink)
        self.scheduler.add(state)
        return state

    def abort(self, request_id: str) -> bool:
        """Abort a queued request (never runs) or a running one (its batch stops at the next step
        once every request in it is aborted). False if the request is unknown or already finished."""
        state, queued = self.scheduler.abort(request_id)
        if state is None:
            return False
        delivered = state.finish(RequestAbortedError(f"request {request_id} was aborted"))
        if delivered:
            self.counters.requests_aborted += 1
            logger.info("aborted %s request %s", "queued" if queued else "running", request_id)
        return delivered

    # -- the loop -----------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._heartbeat.beat("idle")
            if self._dead is not None:
                # Admission is closed: next_batch would return at once, so wait here instead of spinning.
                self._stopping.wait(0.5)
                continue
            batch = self.scheduler.next_batch(timeout=0.5)
            if not batch:
                continue
            self._heartbeat.beat("running")
            outcome: tuple[str, BaseException | None]
            try:
                outcome = self._run_batch(batch)
            except Exception as exc:  # a bug here must fail these requests, not stop the loop
                logger.exception("engine loop error")
                for state in batch:
                    state.finish(WorkerError(f"engine error: {exc}"))
                outcome = ("error", exc)
            finally:
                self.scheduler.done(batch)
                self._heartbeat.beat("idle")
            fatal = self._failures.record(*outcome)
            if fatal is not None:
                self._die(fatal)

    def _run_batch(self, batch: list[RequestState]) -> tuple[str, BaseException | None]:
        """Run one batch; returns its outcome (``ok``, ``error``, ``rejected``, ``aborted``, ``dead``,
        ``empty``) and the error, for the consecutive-failure streak."""
        live = [s for s in batch if not s.aborted and not s.finished]
        if not live:
            return ("empty", None)

        def on_step(step: int, total: int) -> None:
            for state in live:
                if not state.finished:
                    state.sink(ProgressEvent(state.request_id, step, total))

        requests = [s.request for s in live]
        capabilities = self.executor.capabilities
        deadline = batch_deadline_s(requests, self.config.server,
                                    capabilities.default_size if capabilities is not None else None)
        start = time.monotonic()
        try:
            outputs = self.executor.execute(requests, on_step, should_cancel=lambda: all(s.aborted for s in live),
                                            timeout=deadline)
        except RequestAbortedError:
            # Stats first, then the final items: whoever sees a result also sees its batch counted.
            self._emit(live, start, "aborted", None)
            self._deliver([(s, RequestAbortedError(f"request {s.request_id} was aborted")) for s in live])
            return ("aborted", None)
        except DeadlineExceeded:
            self._hung(live, deadline)
            return ("dead", None)
        except EngineDeadError as exc:
            self._die(exc)
            return ("dead", exc)
        except Exception as exc:
            if len(live) > 1:
                # Isolate the failure: rerun each request alone so one bad request fails alone. The
                # reruns make one batch for the failure streak: it failed unless one of them succeeded.
                logger.warning("batch of %d failed (%s); retrying its requests one by one", len(live), exc)
                outcomes = [self._run_batch([state]) for state in live]
                if any(kind == "ok" for kind, _ in outcomes):
                    return ("ok", None)
                if any(kind == "dead" for kind, _ in outcomes):
                    return ("dead", None)
                errors = [error for kind, error in outcomes if kind == "error"]
                return ("error", errors[-1]) if errors else ("rejected", None)
            self._emit(live, start, "error", None)
            self.counters.requests_failed += int(not live[0].finished)
            self._deliver([(live[0], exc)])
            # A request the model refuses is the client's fault, not a sign of a sick engine.
            return ("rejected" if isinstance(exc, RequestError) else "error", exc)
        by_id = {o.request_id: o for o in outputs}
        finals: list[tuple[RequestState, Any]] = []
        for state in live:
            output = by_id.get(state.request_id)
            if output is None:
                finals.append((state, WorkerError(f"the worker returned no output for {state.request_id}")))
                continue
            queue_ms = ((state.started or start) - state.arrival) * 1000.0
            finals.append((state, build_output(state.request, output, queue_ms, self.config.fingerprint)))
        self._emit(live, start, "ok", outputs[0] if outputs else None)
        self.counters.requests_ok += sum(1 for s, item in finals
                                         if not s.finished and not isinstance(item, BaseException))
        self._deliver(finals)
        return ("ok", None)

    def _hung(self, live: list[RequestState], deadline: float) -> None:
        """The batch ran past its deadline: its worker is hung. The executor kills what it can (mp:
        SIGKILL), and the engine dies, failing every waiting and running request."""
        ids = [s.request_id for s in live]
        logger.error("batch %s exceeded its deadline of %.1fs: the worker is hung", ids, deadline)
        error = EngineDeadError(f"a batch ({', '.join(ids)}) exceeded its deadline of {deadline:.1f}s: "
                                f"the {self.executor.name} worker is hung")
        self.executor.abandon(str(error))
        self._die(error)

    def _deliver(self, finals: list[tuple[RequestState, Any]]) -> None:
        """Leave the running set, then hand out the final items: a caller that has its result sees the
        engine's counters, stats and running set already updated."""
        self.scheduler.done([state for state, _ in finals])
        for state, item in finals:
            state.finish(item)

    def _emit(self, live: list[RequestState], start: float, outcome: str, first: RequestResult | None) -> None:
        stats = BatchStats(
            executor=self.executor.name, batch_size=len(live),
            images=sum(s.request.n for s in live),
            request_ids=tuple(s.request_id for s in live),
            queue_ms=tuple(round(((s.started or start) - s.arrival) * 1000.0, 3) for s in live),
            batch_ms=round((time.monotonic() - start) * 1000.0, 3), outcome=outcome,
            phase_ms=dict(first.timings_ms) if first is not None else {},
            kernels={k: first.attestation.get(k) for k in ("linear", "attention", "transformer_forwards")}
            if first is not None else {},
        )
        self.counters.batches += 1
        self.counters.images += stats.images if outcome == "ok" else 0
        self.counters.batch_sizes.append(stats.batch_size)
        for listener in list(self._listeners):
            try:
                listener(stats)
            except Exception:
                logger.exception("stats listener failed")

    def add_stats_listener(self, listener: Callable[[BatchStats], None]) -> None:
        """``listener(BatchStats)`` is called on the engine thread after every non-warmup batch."""
        self._listeners.append(listener)

    # -- warmup, death, shutdown --------------------------------------------------------------------

    def _warmup(self) -> None:
        warm = self.stage.warmup
        request = GenerationRequest(prompt="warmup", height=warm.height, width=warm.width,
                                    num_inference_steps=warm.steps, seed=0, max_sequence_length=64,
                                    request_id="warmup", is_warmup=True)
        start = time.monotonic()
        # Checked against the model (not the request limits: the operator chose it), then straight to the
        # executor: warmup never enters the queue, the counters or the stats (the worker pauses the
        # kernel counters for an all-warmup batch).
        if self.executor.capabilities is not None:
            check_capabilities(request, self.executor.capabilities)
        self.executor.execute([request])
        logger.info("warmup %dx%d, %d step(s) took %.0f ms", warm.width, warm.height, warm.steps,
                    (time.monotonic() - start) * 1000.0)

    def _on_worker_death(self, error: EngineDeadError) -> None:
        """Called from the executor's monitor: fail queued and running requests right away."""
        self._die(error)

    def _die(self, error: EngineDeadError) -> None:
        if self._dead is None:
            self._dead = error
            logger.error("engine is dead: %s", error)
        for state in self.scheduler.drain():
            state.finish(EngineDeadError(str(error)))

    def check_health(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        self.executor.check_health()

    @property
    def is_ready(self) -> bool:
        return self._ready and self._dead is None and not self._is_shutdown

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    @property
    def heartbeat_age_s(self) -> float:
        """Seconds since the loop thread last beat (it beats at least every ~0.5 s while idle)."""
        return self._heartbeat.age_s

    @property
    def loop_state(self) -> str:
        """``idle``, ``running`` (a batch is on the executor) or ``dead`` (engine dead or shut down)."""
        thread = getattr(self, "_thread", None)
        if self._dead is not None or self._is_shutdown or (thread is not None and not thread.is_alive()):
            return "dead"
        return self._heartbeat.state

    def shutdown(self) -> None:
        """Fail waiting requests, stop the loop and the workers. Idempotent."""
        with self._shutdown_lock:
            if self._is_shutdown:
                return
            self._is_shutdown = True
        self._stopping.set()
        for state in self.scheduler.drain():
            state.finish(EngineDeadError("the engine was shut down"))
        self.executor.shutdown()
        thread = getattr(self, "_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10.0)
