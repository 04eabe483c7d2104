"""The engine core: admission, the dispatch loops that run batches on the replicas'
executors (``batch_run.py``: one batch, its step-level joins and its results), abort and
death handling.

``Engine`` and ``AsyncEngine`` are thin front ends over this one loop, so both have the
same semantics. Every request gets exactly one final item through its sink: a
``RequestOutput`` or an exception (``RequestAbortedError``, ``EngineDeadError``,
``WorkerError``, ``RequestError``).

Replicas (``replicas.py``): one dispatch thread per replica pulls a batch from the
shared scheduler only while its replica is free, so the least loaded replica takes the
work and a batch runs once.

Liveness (``watchdog.py``), per replica: a batch past its work-derived deadline means a
hung worker (mp: SIGKILLed), as do ``server.max_consecutive_failures`` failed batches in
a row; loops beat a heartbeat while idle and per batch. With no replica left the engine
is dead: ``/health`` turns 503, not 500.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from diffserve.engine.admission import admit
from diffserve.engine.ar_stage import ArStage, ar_chain
from diffserve.engine.batch_run import BatchRun, Final
from diffserve.engine.decode_stage import DecodeStage
from diffserve.engine.encode_stage import EncodeStage
from diffserve.engine.health import EngineHealth
from diffserve.engine.outcome import Outcome
from diffserve.engine.policy import schedule_policy
from diffserve.engine.replicas import Replica, ReplicaSet
from diffserve.engine.scheduler import RequestState, Scheduler, Sink
from diffserve.engine.stage_loop import StageLoop
from diffserve.engine.stats import BatchStats, EngineCounters
from diffserve.errors import (
    EngineDeadError,
    EngineNotReadyError,
    RequestAbortedError,
    RequestError,
    WorkerError,
)
from diffserve.executor.base import Executor
from diffserve.logging import get_logger
from diffserve.tracing.attributes import REQUEST_ID
from diffserve.tracing.spans import carry, current, span
from diffserve.types.request import GenerationRequest

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import ResolvedConfig

logger = get_logger(__name__)


class EngineCore(EngineHealth):
    """Owns the replicas (executors), the scheduler and the dispatch threads of one
    engine."""

    def __init__(self, config: ResolvedConfig) -> None:
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
        self.replicas = ReplicaSet(config, self.stage)
        # Staged topologies: a stage of its own encodes the prompts first
        # (split_text_encoder and encode_denoise_decode: encode_stage.py) and one
        # decodes last (encode_denoise_decode: decode_stage.py).
        roles = {s.role: s for s in config.stages}
        self.encode = (
            EncodeStage(self, config, roles["text_encoder"])
            if "text_encoder" in roles
            else None
        )
        self.decode = (
            DecodeStage(self, config, roles["decoder"]) if "decoder" in roles else None
        )
        # AR stages (kind: ar, vLLM) run before all of these: the last hands on to the
        # diffusion stages' first queue.
        self.ar = ar_chain(self, config, lambda state: self._diffusion_queue.add(state))
        try:
            for extra in self.side_stages:
                extra.start()
            # Builds and warms every replica; a replica dying from here on is taken out
            # (``_take_out``).
            self.replicas.start(on_dead=self._take_out)
            # The cost model and the step-token budget are the model's: known from the
            # replicas' ready handshake, before any request is queued.
            self.scheduler.configure(
                schedule_policy(self.stage, self.replicas.capabilities)
            )
        except BaseException:
            for extra in self.side_stages:
                extra.shutdown("the engine failed to start")
            raise
        if self._dead is not None:  # every replica died before serving anything
            self.replicas.shutdown()
            raise EngineDeadError(str(self._dead))
        for replica in self.replicas.replicas:
            replica.thread = threading.Thread(
                target=self._loop,
                args=(replica,),
                daemon=True,
                name=f"diffserve-engine-replica-{replica.index}",
            )
            replica.thread.start()
        self._ready = True

    @property
    def extra_stages(self) -> list[StageLoop]:
        """The stages besides the denoising one, in stage order."""
        return [s for s in (self.encode, self.decode) if s is not None]

    @property
    def side_stages(self) -> list[StageLoop | ArStage]:
        """Every stage besides the denoising one, AR stages first: what starts, aborts
        and stops with it."""
        return [*self.ar, *self.extra_stages]

    @property
    def stopping(self) -> threading.Event:
        return self._stopping

    @property
    def is_shut_down(self) -> bool:
        return self._is_shutdown

    def die(self, error: EngineDeadError) -> None:
        """A stage lost its last replica: the engine is dead (``/health`` 503 naming
        it)."""
        self._die(error)

    @property
    def executor(self) -> Executor:
        """A live replica's executor (its name and capabilities are every replica's)."""
        return self.replicas.executor()

    # -- admission
    # ----------------------------------------------------------------------------------

    def admit(self, request: GenerationRequest) -> GenerationRequest:
        """Admission alone (defaults, limits, capabilities, seed: ``admission.py``),
        nothing queued: what a request becomes here, or the error it gets (the video job
        API checks a job when it is created)."""
        self.check_health()
        if not self._ready:
            raise EngineNotReadyError("the engine is still loading or warming up")
        if request.rewrite_prompt and not self.ar:
            raise RequestError(
                "rewrite_prompt: true needs an AR stage (kind: ar), "
                "and this deployment has none",
                param="rewrite_prompt",
            )
        # A stored job, admitted when it was created: not admitted twice.
        if request.carried.admitted:
            return request
        return admit(
            request,
            self.config.server,
            self.replicas.capabilities,
            stage=self.stage,
            model_dir=self.config.model,
        )

    def submit(self, request: GenerationRequest, sink: Sink) -> RequestState:
        """Admit and queue; raises instead of queueing a request that cannot run.
        Tracing on: admission is a span, and the request carries the caller's trace
        context to its workers (``tracing/spans.py``)."""
        with span("diffserve.admission", {REQUEST_ID: request.request_id}):
            admitted = self.admit(request)
        state = RequestState(carry(admitted), sink)
        queue = self._diffusion_queue
        if self.ar and admitted.rewrite_prompt is not False:
            for stage in self.ar:
                stage.check_up()
            queue = self.ar[0].scheduler
        ahead = queue.queue_depth
        queue.add(state)
        logger.debug(
            "request %s queued behind %d: %d image(s), %s step(s)",
            state.request_id,
            ahead,
            admitted.n,
            admitted.num_inference_steps,
        )
        return state

    @property
    def _diffusion_queue(self) -> Scheduler:
        """Where a request enters the diffusion stages: the text encoders' queue, or the
        denoiser's."""
        return self.encode.scheduler if self.encode is not None else self.scheduler

    def abort(self, request_id: str) -> bool:
        """Abort a queued request (never runs) or a running one (its batch stops at the
        next step once every request in it is aborted). False if the request is unknown
        or already finished."""
        state, queued = self.scheduler.abort(request_id)
        for extra in self.side_stages:  # waiting for (or in) another stage
            if state is None:
                state, queued = extra.abort(request_id)
        if state is None:
            return False
        delivered = state.finish(
            RequestAbortedError(f"request {request_id} was aborted")
        )
        if delivered:
            self.counters.requests_aborted += 1
            logger.info(
                "aborted %s request %s", "queued" if queued else "running", request_id
            )
        return delivered

    # -- the loop
    # ----------------------------------------------------------------------------------

    def _loop(self, replica: Replica) -> None:
        """One replica's dispatch loop: it asks for a batch only while its replica is
        free."""
        while not self._stopping.is_set():
            replica.heartbeat.beat("idle")
            if self._dead is not None or not replica.live:
                # Nothing to pull (admission closed, or this replica is out): beat
                # without spinning.
                self._stopping.wait(0.5)
                continue
            batch = self.scheduler.next_batch(timeout=0.5, replica=replica.index)
            if not batch:
                continue
            if not replica.live:
                # It died while this thread waited for work: the batch never reached it,
                # so another replica runs it instead of failing requests that never
                # started.
                self.scheduler.requeue(batch)
                continue
            # Tracing on: the batch's (first) request's context is current, so every
            # line this thread logs about the batch, through its delivery, names the
            # request's trace (tracing/spans.py:current).
            with current([state.request for state in batch]):
                self._run(replica, batch)

    def _run(self, replica: Replica, batch: list[RequestState]) -> None:
        """One batch on ``replica``: run it, free its requests' slots, count the outcome
        for the failure streak."""
        ids = [state.request_id for state in batch]
        started = time.monotonic()
        logger.debug(
            "replica %d runs batch %s after %.0f ms in the queue",
            replica.index,
            ids,
            (started - min(state.arrival for state in batch)) * 1000.0,
        )
        replica.heartbeat.beat("running")
        outcome: tuple[Outcome, BaseException | None]
        run = BatchRun(self, replica, batch)
        try:
            outcome = run.run()
        except (
            Exception
        ) as exc:  # a bug here must fail these requests, not stop the loop
            logger.exception("engine loop error (replica %d)", replica.index)
            for state in batch:
                state.finish(WorkerError(f"engine error: {exc}"))
            outcome = (Outcome.ERROR, exc)
        finally:
            # The requests that joined at a step boundary leave the running set too
            # (one aborted before the worker took it is answered by the abort alone).
            self.scheduler.done(batch + run.live)
            replica.heartbeat.beat("idle")
        logger.debug(
            "replica %d: batch %s ended %s after %.0f ms",
            replica.index,
            ids,
            outcome[0],
            (time.monotonic() - started) * 1000.0,
        )
        fatal = replica.failures.record(*outcome)
        if fatal is not None:
            self._take_out(replica, fatal)

    # -- what a batch run reports back
    # ---------------------------------------------------------------

    def replica_hung(
        self,
        replica: Replica,
        live: list[RequestState],
        deadline: float,
        stalled: str | None = None,
    ) -> None:
        """The batch ran past its deadline, or its worker stopped reporting steps
        (``stalled``: how, from the step heartbeat, ``step_watch.py``): its worker is
        hung. The executor kills what it can (mp: SIGKILL) and the replica is taken out;
        its batch fails (the whole engine dies, failing every waiting request too, if it
        was the last replica)."""
        ids = [s.request_id for s in live]
        what = stalled or f"exceeded its deadline of {deadline:.1f}s"
        logger.error(
            "batch %s %s: the worker of replica %d is hung", ids, what, replica.index
        )
        error = EngineDeadError(
            f"a batch ({', '.join(ids)}) {what}: the {replica.executor.name} worker of "
            f"replica {replica.index} is hung"
        )
        replica.executor.abandon(str(error))
        self.replica_lost(replica, live, error)

    def replica_lost(
        self, replica: Replica, live: list[RequestState], error: EngineDeadError
    ) -> None:
        """The replica is out, and the requests it was running fail (they are not
        retried elsewhere: a request that crashes its worker would take the next replica
        down too). Once the engine is dead they already got its error from ``_die``."""
        self._take_out(replica, error)
        if self._is_shutdown:
            return  # shutdown already failed them
        if self._dead is not None or not self.replicas.live():
            # The last replica is gone: the monitor that took it out may not have marked
            # the engine dead yet, and a caller that gets its error must already see
            # ``is_dead``.
            self._die(error)
            return
        message = (
            f"replica {replica.index} of {self.replicas.count} was "
            "lost while running this request "
            f"({error}); {len(self.replicas.live())} replica(s) "
            "still serve: retry the request"
        )
        self.counters.requests_failed += sum(1 for s in live if not s.finished)
        self.deliver([(state, EngineDeadError(message)) for state in live])

    def deliver(self, finals: list[Final]) -> None:
        """Leave the running set, then hand out the final items: a caller that has its
        result sees the engine's counters, stats and running set already updated."""
        self.scheduler.done([state for state, _ in finals])
        for state, item in finals:
            state.finish(item)

    def publish(self, stats: BatchStats) -> None:
        """Count a batch's stats and hand them to every stats listener (on the engine
        thread)."""
        self.counters.batches += 1
        self.counters.images += stats.images if stats.outcome == Outcome.OK else 0
        self.counters.batch_sizes.append(stats.batch_size)
        for listener in list(self._listeners):
            try:
                listener(stats)
            except Exception:
                logger.exception("stats listener failed")

    def add_stats_listener(self, listener: Callable[[BatchStats], None]) -> None:
        """``listener(BatchStats)`` is called on the engine thread after every
        non-warmup batch."""
        self._listeners.append(listener)

    # -- warmup, death, shutdown
    # --------------------------------------------------------------------

    def shutdown(self) -> None:
        """Fail waiting requests, stop the loop and the workers. Idempotent."""
        with self._shutdown_lock:
            if self._is_shutdown:
                return
            self._is_shutdown = True
        self._stopping.set()
        for extra in self.side_stages:
            extra.shutdown("the engine was shut down")
        for state in self.scheduler.drain():
            state.finish(EngineDeadError("the engine was shut down"))
        self.replicas.shutdown()
        for replica in self.replicas.replicas:
            thread = replica.thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=10.0)
