"""The worker's command loop, shared by the uni executor (a thread) and the mp executor
(a process).

One loop for both is what makes their semantics identical: commands are served strictly
one at a time, an RPC that arrives during a batch is deferred until the batch ends (RPCs
never run during a forward), and a ``cancel`` for the running batch is noticed between
denoise steps.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from diffserve.errors import DiffserveError, RequestError
from diffserve.logging import get_logger
from diffserve.tracing.attributes import worker_attributes
from diffserve.tracing.batch import batch_trace
from diffserve.types.channel import Channel, ChannelClosed
from diffserve.types.messages import Command, Reply
from diffserve.worker.worker import Worker

if TYPE_CHECKING:  # pragma: no cover
    pass

logger = get_logger(__name__)

# How often an idle mp worker checks that its parent is still alive.
_PARENT_CHECK_S = 1.0


def error_reply(call_id: int, rank: int, exc: BaseException) -> Reply:
    """The one way a worker reports an exception (same fields on uni and mp)."""
    remote_type = getattr(exc, "remote_type", None) or type(exc).__name__
    return Reply(
        "error",
        call_id,
        rank,
        error_type=remote_type,
        message=str(exc) or remote_type,
        traceback="".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)
        ),
        param=exc.param if isinstance(exc, RequestError) else None,
    )


class CommandLoop:
    """Serves commands from ``channel`` on ``worker`` until shutdown or the channel
    closes."""

    def __init__(
        self,
        channel: Channel,
        worker: Worker,
        parent_alive: Callable[[], bool] | None = None,
    ) -> None:
        self.channel = channel
        self.worker = worker
        self.parent_alive = parent_alive
        self._deferred: deque[Command] = deque()
        # requests joining the running batch (step-level batching)
        self._joins: list = []
        self._stop = False

    def run(self) -> None:
        while not self._stop:
            command = self._deferred.popleft() if self._deferred else self._next()
            if command is None:
                return
            self._handle(command)

    def _next(self) -> Command | None:
        while True:
            if self.channel.poll(_PARENT_CHECK_S if self.parent_alive else None):
                try:
                    return self.channel.recv()
                except ChannelClosed:
                    return None
            if self.parent_alive is not None and not self.parent_alive():
                logger.warning(
                    "worker rank=%d: parent is gone, exiting", self.worker.rank
                )
                return None

    def _handle(self, command: Command) -> None:
        rank = self.worker.rank
        if command.kind == "shutdown":
            self._stop = True
        elif command.kind in ("cancel", "join"):
            # the batch it targeted already finished (the engine reruns requests that
            # never joined)
            pass
        elif command.kind == "rpc":
            try:
                value = self.worker.call(command.method, command.args, command.kwargs)
                self._send(Reply("result", command.call_id, rank, value=value))
            except Exception as exc:  # one failing RPC never takes the worker down
                self._send(error_reply(command.call_id, rank, exc))
        elif command.kind == "execute":
            self._execute(command)
        else:
            self._send(
                Reply(
                    "error",
                    command.call_id,
                    rank,
                    error_type="ValueError",
                    message=f"unknown command {command.kind!r}",
                )
            )

    def _execute(self, command: Command) -> None:
        rank, call_id = self.worker.rank, command.call_id
        # The batch's spans in this process (tracing/batch.py); a shared no-op unless
        # tracing is on here.
        trace = batch_trace(command.batch or [], self._trace_attributes)

        def on_step(
            step: int, total: int, progress: tuple = (), previews: tuple = ()
        ) -> None:
            trace.step(step, total, progress)
            self._send(
                Reply(
                    "step",
                    call_id,
                    rank,
                    step=step,
                    total_steps=total,
                    progress=progress,
                    previews=previews,
                )
            )

        def joins() -> list:
            taken, self._joins = self._joins, []
            trace.join(taken)
            return taken

        step_level = command.kwargs.get("step_level", False)
        self._joins = []
        ids = [request.request_id for request in command.batch or []]
        try:
            # Tracing on: the batch's trace is current inside, so the lines logged while
            # it runs name it.
            with trace:
                logger.debug("worker rank=%d: batch %s starts", rank, ids)
                started = time.perf_counter()
                outputs = self.worker.execute(
                    command.batch or [],
                    on_step,
                    lambda: self._cancelled(call_id),
                    joins=joins if step_level else None,
                    on_partial=(
                        lambda results: self._send(
                            Reply("partial", call_id, rank, value=trace.finish(results))
                        )
                    )
                    if step_level
                    else None,
                )
                trace.finish(outputs)
                logger.debug(
                    "worker rank=%d: batch %s %s in %.0f ms",
                    rank,
                    ids,
                    "cancelled" if outputs is None else "done",
                    (time.perf_counter() - started) * 1000.0,
                )
        except Exception as exc:
            self._send(error_reply(call_id, rank, exc))
            return
        self._send(
            Reply("cancelled", call_id, rank)
            if outputs is None
            else Reply("result", call_id, rank, value=outputs)
        )

    def _trace_attributes(self) -> dict[str, Any]:
        worker = self.worker
        return worker_attributes(
            worker.config,
            worker.stage,
            executor=worker.executor,
            replica=worker.replica,
            rank=worker.rank,
            device=worker.device,
        )

    def _cancelled(self, call_id: int) -> bool:
        """Drain pending commands between steps: a cancel or shutdown stops the batch,
        others wait."""
        if self.parent_alive is not None and not self.parent_alive():
            self._stop = True
            return True
        stop = False
        while self.channel.poll(0):
            try:
                command = self.channel.recv()
            except ChannelClosed:
                self._stop = True
                return True
            if command.kind == "cancel" and command.call_id == call_id:
                stop = True
            elif command.kind == "join":
                if command.call_id == call_id:
                    self._joins.extend(command.batch or [])
            elif command.kind == "shutdown":
                self._stop = True
                stop = True
            elif command.kind not in ("cancel", "join"):
                self._deferred.append(command)
        return stop

    def _send(self, reply: Reply) -> None:
        try:
            self.channel.send(reply)
        except ChannelClosed:
            self._stop = True


def serve(
    channel: Channel,
    make_worker: Callable[[], Worker],
    parent_alive: Callable[[], bool] | None = None,
) -> None:
    """Build and load the worker, report ready (or why not), then serve commands."""
    try:
        worker = make_worker()
        info = worker.load()
    except Exception as exc:
        # A bad file or config: its message says what to fix.
        if isinstance(exc, DiffserveError):
            logger.error("worker failed to start: %s: %s", type(exc).__name__, exc)
        else:
            logger.exception("worker failed to start")
        with contextlib.suppress(ChannelClosed):
            channel.send(replace(error_reply(0, -1, exc), kind="init_failed"))
        return
    channel.send(Reply("ready", 0, worker.rank, value=info))
    CommandLoop(channel, worker, parent_alive).run()
