"""The executor contract (``executor/factory.py`` picks an implementation from the
resolved config).

``Executor`` implements the semantics once; ``uni`` and ``mp`` only differ in how a
worker is started, how a command reaches it and how its death is noticed:

* ``execute(batch, on_step, should_cancel, timeout)`` -> one ``RequestResult`` per
  request (rank 0's).
  ``should_cancel()`` is polled while the batch runs; when it turns true the worker
  stops at the next denoise step and ``RequestAbortedError`` is raised. A timeout
  cancels the batch the same way and raises ``DeadlineExceeded`` (a ``TimeoutError``).
* ``collective_rpc(method, args, kwargs, timeout)`` -> a flat list, one value per rank,
  in rank order.
  A timeout raises ``TimeoutError`` (the late reply is dropped); an exception inside a
  worker raises ``WorkerError`` (or the original diffserve error type), and the worker
  keeps serving.
* A dead worker fails every in-flight and later call with ``EngineDeadError`` within a
  second.
* ``abandon(reason)``: the workers are hung (a batch ran past its deadline). The
  executor is marked
  dead at once; mp SIGKILLs its worker processes, uni can only leave its thread behind.
* ``shutdown()`` is idempotent, leaves no worker process behind and never waits
  unboundedly.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from diffserve.errors import EngineDeadError, RequestAbortedError
from diffserve.executor.calls import (
    CallTable,
    PartialCallback,
    PendingCall,
    StepCallback,
)
from diffserve.logging import get_logger
from diffserve.types.memory import describe_weights
from diffserve.types.messages import Command, Reply, WorkerInfo
from diffserve.types.results import RequestResult

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import ResolvedConfig
    from diffserve.types.capabilities import PipelineCapabilities
    from diffserve.types.request import GenerationRequest

logger = get_logger(__name__)

# Step-level batching: () -> (requests to join the running batch, seconds they add to
# its deadline).
Joiner = Callable[[], "tuple[list[GenerationRequest], float]"]

# How often a waiting caller re-checks its cancel predicate (abort latency on top of one
# step).
_CANCEL_POLL_S = 0.02
DEFAULT_READY_TIMEOUT_S = 300.0


class DeadlineExceeded(TimeoutError):
    """An ``execute`` ran past its timeout (the batch was cancelled; a hung worker never
    answers)."""


class Executor(ABC):
    """Runs batches and RPCs on ``world_size`` workers of one stage."""

    name: str = "base"

    def __init__(
        self,
        config: ResolvedConfig,
        stage_id: int,
        replica: int = 0,
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.stage_id = stage_id
        # Which copy of the stage's worker group this is (``num_replicas``); reported in
        # attestations.
        self.replica = replica
        # Ranks come from the resolved config only (the resolver checked this executor
        # can run them).
        self.world_size = config.stage(stage_id).parallel.world_size
        self.ready_timeout = ready_timeout
        self.calls = CallTable()
        # One WorkerInfo per rank, from the ready handshake, in rank order.
        self.workers: list[WorkerInfo] = []
        # Called once (from a monitor thread) when a worker dies; the engine uses it to
        # fail fast.
        self.on_dead: Callable[[EngineDeadError], None] | None = None
        self._shutdown_lock = threading.Lock()
        self._is_shutdown = False
        # One per rank: delivers its replies, notices its death.
        self._readers: list[threading.Thread] = []

    @property
    def worker_pids(self) -> list[int]:
        return [info.pid for info in self.workers]

    @property
    def capabilities(self) -> PipelineCapabilities | None:
        """What rank 0's pipeline can serve (``None``: no model loaded)."""
        return self.workers[0].capabilities if self.workers else None

    def _launch(self) -> None:
        """The start every executor shares; a subclass calls it at the end of its
        ``__init__``: start the workers and wait for their ready handshakes
        (``_start_workers``), shutting down whatever started if that fails, then one
        reader thread per rank (``_read_replies``)."""
        try:
            self._start_workers()
        except BaseException:
            self.shutdown()
            raise
        for rank in range(self.world_size):
            reader = threading.Thread(
                target=self._read_replies,
                args=(rank,),
                daemon=True,
                name=f"diffserve-{self.name}-reader-{self.replica}-{rank}",
            )
            reader.start()
            self._readers.append(reader)
        weights = self.workers[0].weights if self.workers else {}
        logger.info(
            "%s executor: %d worker(s) ready, pids=%s%s%s",
            self.name,
            self.world_size,
            self.worker_pids,
            self._ready_detail(),
            f"; weights: {describe_weights(weights)}" if weights else "",
        )

    def _join_readers(self, timeout: float) -> None:
        for reader in self._readers:
            if reader is not threading.current_thread():
                reader.join(timeout=timeout)

    # -- what subclasses provide
    # --------------------------------------------------------------------

    @abstractmethod
    def _start_workers(self) -> None:
        """Start ``world_size`` workers and append each ready handshake's ``WorkerInfo``
        to ``workers``, in rank order; raise if one cannot start (``_launch`` then shuts
        down the others)."""

    @abstractmethod
    def _read_replies(self, rank: int) -> None:
        """Until the worker is gone: hand each reply of ``rank`` to ``_deliver``; then
        ``_mark_dead`` (unless shutting down). Runs on the rank's reader thread; must
        not raise."""

    def _ready_detail(self) -> str:
        """More to say in the ready log line (e.g. the Ray nodes)."""
        return ""

    @abstractmethod
    def _send(self, rank: int, command: Command) -> None:
        """Deliver one command to one worker (raise ``EngineDeadError`` if it cannot be
        reached)."""

    @abstractmethod
    def _stop_workers(self) -> None:
        """Stop every worker and release channels; must not raise."""

    def _kill_hung(self) -> None:  # noqa: B027 - only executors that own processes can kill them
        """Forcibly stop hung workers (after ``abandon`` marked the executor dead); must
        not raise."""

    # -- the shared semantics
    # -----------------------------------------------------------------------

    def execute(
        self,
        batch: list[GenerationRequest],
        on_step: StepCallback | None = None,
        should_cancel: Callable[[], bool] | None = None,
        timeout: float | None = None,
        joiner: Joiner | None = None,
        on_partial: PartialCallback | None = None,
        stalled: Callable[[], str | None] | None = None,
    ) -> list[RequestResult]:
        """Run one batch on every rank (SPMD) and return rank 0's outputs. ``stalled()``
        (the step heartbeat) is polled too: a reason from it ends the batch like its
        deadline.

        Step-level batching (``joiner`` given): while the batch runs, ``joiner()`` is
        polled for requests to add at the next step boundary (and the seconds they add
        to the deadline); ``on_partial`` gets the results of requests that finish before
        the batch does, and the return value holds the rest.
        """
        step_level = joiner is not None
        call = self._broadcast(
            Command("execute", batch=list(batch), kwargs={"step_level": step_level}),
            on_step,
            on_partial,
        )
        try:
            try:
                self._wait(call, timeout, should_cancel, joiner, stalled)
            except TimeoutError as exc:
                raise DeadlineExceeded(str(exc)) from exc
            values = call.values()
            if call.cancelled:
                raise RequestAbortedError("batch cancelled between denoise steps")
            return values[0]
        finally:
            self.calls.close(call)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Call ``method`` on every worker; one result per rank, in rank order."""
        call = self._broadcast(
            Command("rpc", method=method, args=tuple(args), kwargs=dict(kwargs or {}))
        )
        try:
            self._wait(call, timeout, None)
            return call.values()
        finally:
            self.calls.close(call)

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` if a worker died or the executor was shut down."""
        if self.calls.dead is not None:
            raise EngineDeadError(str(self.calls.dead))
        if self._is_shutdown:
            raise EngineDeadError("executor was shut down")

    @property
    def is_dead(self) -> bool:
        return self.calls.dead is not None or self._is_shutdown

    def abandon(self, reason: str) -> None:
        """The workers are hung: fail every call now (``EngineDeadError(reason)``), then
        kill what can be killed. A cancel was already sent by the timed-out call; a hung
        worker cannot act on it."""
        self._mark_dead(reason)
        try:
            self._kill_hung()
        except Exception:  # never let cleanup hide the death itself
            logger.exception("%s executor: stopping hung workers failed", self.name)

    def shutdown(self) -> None:
        """Stop the workers. Idempotent; in-flight calls fail with
        ``EngineDeadError``."""
        with self._shutdown_lock:
            if self._is_shutdown:
                return
            self._is_shutdown = True
        logger.info(
            "%s executor: shutting down %d worker(s)", self.name, self.world_size
        )
        self._stop_workers()
        if self.calls.dead is None:
            self.calls.fail_all(EngineDeadError("executor was shut down"))

    # -- helpers
    # ----------------------------------------------------------------------------------

    def _broadcast(
        self,
        command: Command,
        on_step: StepCallback | None = None,
        on_partial: PartialCallback | None = None,
    ) -> PendingCall:
        self.check_health()
        call = self.calls.open(self.world_size, on_step, on_partial)
        command.call_id = call.call_id
        try:
            for rank in range(self.world_size):
                self._send(rank, command)
        except BaseException:
            self.calls.close(call)
            raise
        return call

    def _wait(
        self,
        call: PendingCall,
        timeout: float | None,
        should_cancel: Callable[[], bool] | None,
        joiner: Joiner | None = None,
        stalled: Callable[[], str | None] | None = None,
    ) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        cancel_sent = False
        while True:
            if joiner is not None and not cancel_sent:
                joining, extra_s = joiner()
                if joining:
                    self._send_all(
                        Command("join", call_id=call.call_id, batch=list(joining))
                    )
                    deadline = None if deadline is None else deadline + extra_s
            remaining = None if deadline is None else deadline - time.monotonic()
            slice_s = (
                _CANCEL_POLL_S if should_cancel is not None and not cancel_sent else 0.5
            )
            if remaining is not None:
                slice_s = max(0.0, min(slice_s, remaining))
            if call.done.wait(slice_s):
                return
            if not cancel_sent and should_cancel is not None and should_cancel():
                self._cancel(call)
                cancel_sent = True
            if deadline is not None and time.monotonic() >= deadline:
                if not cancel_sent:
                    self._cancel(call)
                raise TimeoutError(
                    f"{self.name} executor: no reply within {timeout:.1f}s"
                )
            why = stalled() if stalled is not None else None
            if why is not None:
                if not cancel_sent:
                    self._cancel(call)
                raise TimeoutError(f"{self.name} executor: {why}")

    def _cancel(self, call: PendingCall) -> None:
        self._send_all(Command("cancel", call_id=call.call_id))

    def _send_all(self, command: Command) -> None:
        """``command`` to every rank; a dead worker ends it quietly (the call fails on
        its own)."""
        for rank in range(self.world_size):
            try:
                self._send(rank, command)
            except EngineDeadError:
                return

    def _deliver(self, reply: Reply) -> None:
        self.calls.deliver(reply)

    def _mark_dead(self, reason: str) -> None:
        """Called by a monitor when a worker is gone without being asked to stop."""
        if self._is_shutdown or self.calls.dead is not None:
            return
        error = EngineDeadError(reason)
        logger.error("%s executor: %s", self.name, reason)
        self.calls.fail_all(error)
        if self.on_dead is not None:
            try:
                self.on_dead(error)
            except Exception:
                logger.exception("on_dead callback failed")
