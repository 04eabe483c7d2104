"""Bookkeeping of in-flight calls, shared by every executor so that replies, errors,
timeouts and a dead worker are handled by exactly one piece of code."""

from __future__ import annotations

import contextvars
import itertools
import threading
from collections.abc import Callable
from typing import Any

from diffserve import errors
from diffserve.errors import DiffserveError, EngineDeadError, RequestError, WorkerError
from diffserve.logging import get_logger
from diffserve.types.messages import Reply

logger = get_logger(__name__)

StepCallback = Callable[..., None]  # (step, total_steps, progress, previews)
PartialCallback = Callable[[Any], None]


class PendingCall:
    """One command sent to ``ranks`` workers; complete when every rank has answered."""

    def __init__(
        self,
        call_id: int,
        ranks: int,
        on_step: StepCallback | None,
        on_partial: PartialCallback | None = None,
    ) -> None:
        self.call_id = call_id
        self.ranks = ranks
        self.on_step = on_step
        self.on_partial = on_partial
        self.replies: dict[int, Reply] = {}
        self.failure: BaseException | None = None
        self.done = threading.Event()
        # The caller's context variables (tracing: its request's trace), for the
        # callbacks a reader thread runs, so what they log names the same trace as the
        # caller's own lines.
        self.context = contextvars.copy_context()

    def values(self) -> list[Any]:
        """Per-rank values in rank order; raises the first rank's error (or the
        failure)."""
        if self.failure is not None:
            raise self.failure
        for rank in sorted(self.replies):
            reply = self.replies[rank]
            if reply.kind == "error":
                raise remote_exception(reply)
        return [self.replies[rank].value for rank in sorted(self.replies)]

    @property
    def cancelled(self) -> bool:
        return any(r.kind == "cancelled" for r in self.replies.values())


class CallTable:
    """Thread-safe map call_id -> PendingCall. Reader threads deliver, callers wait."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, PendingCall] = {}
        self._ids = itertools.count(1)
        self._dead: EngineDeadError | None = None

    def open(
        self,
        ranks: int,
        on_step: StepCallback | None = None,
        on_partial: PartialCallback | None = None,
    ) -> PendingCall:
        with self._lock:
            if self._dead is not None:
                raise EngineDeadError(str(self._dead))
            call = PendingCall(next(self._ids), ranks, on_step, on_partial)
            self._calls[call.call_id] = call
            return call

    def close(self, call: PendingCall) -> None:
        """Forget a call (after it completed or its caller gave up): a late reply is
        dropped."""
        with self._lock:
            self._calls.pop(call.call_id, None)

    def deliver(self, reply: Reply) -> None:
        with self._lock:
            call = self._calls.get(reply.call_id)
        if call is None:
            return  # the caller timed out or went away; nobody waits for this reply
        if reply.kind in ("step", "partial"):
            # One reader thread: the call's context is never entered twice at once.
            if reply.rank == 0:
                call.context.run(_callback, call, reply)
            return
        call.replies[reply.rank] = reply
        if len(call.replies) >= call.ranks:
            call.done.set()

    def fail_all(self, error: EngineDeadError) -> None:
        """A worker died: every in-flight and later call fails with ``error``."""
        with self._lock:
            self._dead = error
            calls = list(self._calls.values())
            self._calls.clear()
        for call in calls:
            call.failure = EngineDeadError(str(error))
            call.done.set()

    @property
    def dead(self) -> EngineDeadError | None:
        return self._dead


def _callback(call: PendingCall, reply: Reply) -> None:
    try:
        if reply.kind == "step" and call.on_step is not None:
            call.on_step(reply.step, reply.total_steps, reply.progress, reply.previews)
        elif reply.kind == "partial" and call.on_partial is not None:
            call.on_partial(reply.value)
    except Exception:  # a broken consumer must not kill the reader thread
        logger.exception("%s callback failed", reply.kind)


def remote_exception(reply: Reply) -> Exception:
    """Turn an ``error`` reply into the exception the caller sees (identical for uni and
    mp).

    Request errors keep their type and field (they become HTTP 400); other diffserve
    errors (config, backend, model load) keep their type; anything else is a
    ``WorkerError`` that carries the remote type and traceback.
    """
    if reply.error_type == "RequestError":
        return RequestError(reply.message, param=reply.param)
    cls = getattr(errors, reply.error_type, None)
    if (
        isinstance(cls, type)
        and issubclass(cls, DiffserveError)
        and cls is not WorkerError
        and cls is not errors.ConfigErrors
    ):
        try:
            exc = cls(reply.message)
            exc.remote_traceback = reply.traceback  # type: ignore[attr-defined]
            return exc
        except TypeError:
            pass
    return WorkerError(
        f"{reply.error_type}: {reply.message}",
        remote_type=reply.error_type,
        remote_traceback=reply.traceback,
    )
