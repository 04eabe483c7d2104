"""FIFO admission and batching of compatible requests.

The oldest waiting request always goes next; it is batched with later requests that
share its batch key (``types/batching.py``: size, steps, guidance, sequence length...),
up to ``max_batch_size``. Requests with another key keep their place, so an incompatible
request never blocks the queue head, and one never waits behind more than the batch in
flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diffserve.errors import EngineDeadError, EngineOverloadedError, RequestError
from diffserve.logging import get_logger
from diffserve.tracing.spans import queue_waited
from diffserve.types.batching import BatchKey, batch_key
from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput

logger = get_logger(__name__)

# What a request's sink receives: its ProgressEvents, then exactly one final item (an
# output or an error).
FinalItem = RequestOutput | BaseException
Sink = Callable[[ProgressEvent | FinalItem], None]


@dataclass(eq=False)
class RequestState:
    """A request inside the engine, from admission to its final item."""

    request: GenerationRequest
    sink: Sink
    arrival: float = field(default_factory=time.monotonic)
    started: float | None = None
    aborted: bool = False
    finished: bool = False
    # Staged topologies: an attestation entry per stage it went through before this one,
    # and what those stages report at the top level of the final attestation
    # (engine/encode_stage.py).
    stages: list[dict[str, Any]] = field(default_factory=list)
    carried: dict[str, Any] = field(default_factory=dict)
    # E.g. the text-encoder stage's "encode".
    stage_timings_ms: dict[str, float] = field(default_factory=dict)
    # AR stages (engine/ar_stage.py): the prompt as the client wrote it, the attestation
    # entry of each AR stage it went through, and the prompt they drew (None: no AR
    # stage rewrote it).
    original_prompt: str | None = None
    ar: list[dict[str, Any]] = field(default_factory=list)
    revised_prompt: str | None = None
    # encode_denoise_decode: the denoising stage's result while the decoding stage
    # works, and its queue time.
    handed: Any = None
    queue_ms: float = 0.0
    # Where it runs and how far it got (engine/load.py: the outstanding work a router
    # sees).
    replica: int | None = None
    steps_done: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def finish(self, item: FinalItem) -> bool:
        """Deliver the final item exactly once (an abort may race the batch's
        result)."""
        with self.lock:
            if self.finished:
                return False
            self.finished = True
        self.sink(item)
        return True


class Scheduler:
    """Thread-safe waiting queue plus the set of running requests."""

    def __init__(self, max_batch_size: int, max_queue: int) -> None:
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_queue = max(1, int(max_queue))
        self._cond = threading.Condition()
        self._waiting: list[RequestState] = []
        self._running: dict[str, RequestState] = {}
        self._closed = False

    def add(self, state: RequestState) -> None:
        with self._cond:
            if self._closed:
                raise EngineDeadError(
                    "the engine is shut down or dead; no new requests are accepted"
                )
            if len(self._waiting) >= self.max_queue:
                raise EngineOverloadedError(
                    f"{len(self._waiting)} requests are already waiting "
                    f"(server.max_queue={self.max_queue});"
                    " retry later"
                )
            if state.request_id in self._running or any(
                s.request_id == state.request_id for s in self._waiting
            ):
                raise RequestError(
                    f"request_id {state.request_id!r} is already in flight",
                    param="request_id",
                )
            self._waiting.append(state)
            self._cond.notify()

    def next_batch(
        self, timeout: float | None = None, replica: int | None = None
    ) -> list[RequestState]:
        """The oldest request plus compatible followers, to run on ``replica``; empty if
        nothing arrived within ``timeout``."""
        with self._cond:
            if not self._waiting and not self._closed:
                self._cond.wait(timeout)
            if not self._waiting:
                return []
            head = self._waiting[0]
            key = batch_key(head.request)
            batch = [s for s in self._waiting if batch_key(s.request) == key][
                : self.max_batch_size
            ]
            chosen = {id(s) for s in batch}
            self._waiting = [s for s in self._waiting if id(s) not in chosen]
            self._start(batch, replica)
        queue_waited(batch)
        return batch

    def _start(self, taken: list[RequestState], replica: int | None) -> None:
        """``taken`` left the queue for ``replica``: running from now (holds the
        lock)."""
        now = time.monotonic()
        for state in taken:
            state.started, state.replica = now, replica
            self._running[state.request_id] = state

    def next_any(
        self, room: int, timeout: float | None = None, replica: int | None = None
    ) -> list[RequestState]:
        """Up to ``room`` of the oldest requests whatever their batch keys (an AR
        stage's vLLM engine batches any prompts together); empty if nothing arrived
        within ``timeout``."""
        with self._cond:
            if not self._waiting and not self._closed and timeout != 0:
                self._cond.wait(timeout)
            taken, self._waiting = (
                self._waiting[: max(0, room)],
                self._waiting[max(0, room) :],
            )
            self._start(taken, replica)
        queue_waited(taken)
        return taken

    def take_joinable(
        self, key: BatchKey, room: int, replica: int | None = None
    ) -> list[RequestState]:
        """Step-level batching: up to ``room`` requests from the HEAD of the queue while
        they share ``key`` (never past an older request of another key, so joins cannot
        starve it)."""
        with self._cond:
            taken: list[RequestState] = []
            while (
                self._waiting
                and len(taken) < room
                and batch_key(self._waiting[0].request) == key
            ):
                taken.append(self._waiting.pop(0))
            self._start(taken, replica)
        queue_waited(taken)
        return taken

    def done(self, batch: list[RequestState]) -> None:
        with self._cond:
            for state in batch:
                self._running.pop(state.request_id, None)

    def requeue(self, batch: list[RequestState]) -> None:
        """Put a batch that never reached a worker back at the head of the queue, in its
        order (its replica was lost before it could run it). Nothing to do once the
        queue was drained."""
        with self._cond:
            if self._closed:
                return
            for state in batch:
                self._running.pop(state.request_id, None)
                state.started, state.replica, state.steps_done = None, None, 0
            self._waiting[:0] = [s for s in batch if not s.aborted and not s.finished]
            self._cond.notify_all()

    def abort(self, request_id: str) -> tuple[RequestState | None, bool]:
        """Mark a request aborted. Returns (state, was_queued); (None, False) if unknown
        or finished."""
        with self._cond:
            for i, state in enumerate(self._waiting):
                if state.request_id == request_id:
                    del self._waiting[i]
                    state.aborted = True
                    return state, True
            running = self._running.get(request_id)
            if running is not None:
                running.aborted = True
            return running, False

    def drain(self) -> list[RequestState]:
        """Close admission and return every waiting and running request (engine death or
        shutdown)."""
        with self._cond:
            self._closed = True
            states = self._waiting + list(self._running.values())
            self._waiting = []
            self._running.clear()
            self._cond.notify_all()
            return states

    def snapshot(self) -> tuple[list[RequestState], list[RequestState]]:
        """The waiting and the running requests, as of now."""
        with self._cond:
            return list(self._waiting), list(self._running.values())

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._waiting)

    @property
    def num_running(self) -> int:
        with self._cond:
            return len(self._running)
