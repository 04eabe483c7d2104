"""Admission, batching and joins of one stage's requests, cost-aware.

Waiting requests sit in lanes by shape and are served by deficit round robin over the
cost model's token-steps (``queues.py``, where the rules and the no-starvation argument
are written down; ``policy.py`` for the cost, the step-token budget and the quantum).

- ``next_batch``: a request-level stage takes one lane's requests (one ``batch_key``) up
  to ``max_batch_size`` and the step-token budget; a step-level stage takes the ring of
  the oldest waiting request (one ``step_key``) and fills the budget across its lanes.
- ``take_joinable``: a running step-level batch's room (``join_room``: requests and
  step tokens left) filled by the same round robin, never past an oldest waiting request
  of another ``step_key``.
- With one lane this is FIFO, as it always was.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterable

from diffserve.engine.load import LaneLoad, ScheduleLoad, lane_label
from diffserve.engine.policy import SchedulePolicy
from diffserve.engine.queues import LaneQueues, Room
from diffserve.engine.request_state import FinalItem, RequestState, Sink
from diffserve.errors import EngineDeadError, EngineOverloadedError, RequestError
from diffserve.logging import get_logger
from diffserve.tracing.spans import queue_waited
from diffserve.types.request import GenerationRequest

# RequestState and its sink types live in request_state.py (the lanes and the load
# report need them without importing the scheduler); importers keep this name for them.
__all__ = ["FinalItem", "RequestState", "Scheduler", "Sink"]

logger = get_logger(__name__)


class Scheduler:
    """Thread-safe waiting lanes plus the set of running requests."""

    def __init__(
        self, max_batch_size: int, max_queue: int, policy: SchedulePolicy | None = None
    ) -> None:
        self.max_batch_size = max(1, int(max_batch_size))
        self.max_queue = max(1, int(max_queue))
        self._cond = threading.Condition()
        self._queues = LaneQueues(self.max_batch_size, policy or SchedulePolicy())
        self._running: dict[str, RequestState] = {}
        self._closed = False
        self._joins = 0

    def configure(self, policy: SchedulePolicy) -> None:
        """Cost model, budget and lanes of the model being served (the engine calls it
        once the replicas' capabilities are known, before the first request)."""
        with self._cond:
            self._queues.reconfigure(policy)

    @property
    def policy(self) -> SchedulePolicy:
        return self._queues.policy

    @property
    def step_level(self) -> bool:
        """Batches join requests at step boundaries (``policy.joins_steps``)."""
        return self._queues.policy.step_level

    def add(self, state: RequestState) -> None:
        with self._cond:
            if self._closed:
                raise EngineDeadError(
                    "the engine is shut down or dead; no new requests are accepted"
                )
            if len(self._queues) >= self.max_queue:
                raise EngineOverloadedError(
                    f"{len(self._queues)} requests are already waiting "
                    f"(server.max_queue={self.max_queue});"
                    " retry later"
                )
            if state.request_id in self._running or state.request_id in self._queues:
                raise RequestError(
                    f"request_id {state.request_id!r} is already in flight",
                    param="request_id",
                )
            self._queues.push(state)
            self._cond.notify()

    def next_batch(
        self, timeout: float | None = None, replica: int | None = None
    ) -> list[RequestState]:
        """The next batch by deficit round robin (``queues.py``), to run on
        ``replica``; empty if nothing arrived within ``timeout``."""
        with self._cond:
            if not len(self._queues) and not self._closed:
                self._cond.wait(timeout)
            batch = self._queues.next_batch()
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
        """Up to ``room`` of the oldest requests whatever their lanes (an AR stage's
        vLLM engine batches any prompts together); empty if nothing arrived within
        ``timeout``."""
        with self._cond:
            if not len(self._queues) and not self._closed and timeout != 0:
                self._cond.wait(timeout)
            taken = self._queues.take_oldest(Room(max(0, room)))
            self._start(taken, replica)
        queue_waited(taken)
        return taken

    def join_key(self, request: GenerationRequest) -> Hashable:
        """What a running batch of ``request`` admits joins by: its ``step_key`` on a
        step-level stage, else its lane (``batch_key``)."""
        policy = self._queues.policy
        return policy.ring_key(request) if self.step_level else policy.lane_key(request)

    def join_room(self, live: Iterable[GenerationRequest]) -> tuple[int, int | None]:
        """The room of a running batch whose unfinished requests are ``live``: requests
        below ``max_batch_size``, and step tokens below the budget (None: no token
        budget)."""
        live = list(live)
        policy = self._queues.policy
        tokens = (
            policy.budget - sum(policy.step_tokens(r) for r in live)
            if policy.budget > 0
            else None
        )
        return self.max_batch_size - len(live), tokens

    def take_joinable(
        self,
        key: Hashable,
        room: int,
        replica: int | None = None,
        *,
        tokens: int | None = None,
    ) -> list[RequestState]:
        """Requests to join a running batch of ``key`` (``join_key``): at most ``room``
        of them and ``tokens`` step tokens (None: no token cap). Step-level: the round
        robin of ``key``'s lanes, with its reservation, and nothing while the oldest
        waiting request has another key. Request-level: the oldest requests while they
        are of ``key``'s lane."""
        with self._cond:
            space = Room(room, tokens)
            taken = (
                self._queues.joins(key, space)
                if self.step_level
                else self._queues.take_oldest(space, key)
            )
            self._start(taken, replica)
            self._joins += len(taken)
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
            self._queues.push_front(
                [s for s in batch if not s.aborted and not s.finished]
            )
            self._cond.notify_all()

    def abort(self, request_id: str) -> tuple[RequestState | None, bool]:
        """Mark a request aborted. Returns (state, was_queued); (None, False) if unknown
        or finished."""
        with self._cond:
            state = self._queues.remove(request_id)
            if state is not None:
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
            states = self._queues.pop_all() + list(self._running.values())
            self._running.clear()
            self._cond.notify_all()
            return states

    def snapshot(self) -> tuple[list[RequestState], list[RequestState]]:
        """The waiting (oldest first) and the running requests, as of now."""
        with self._cond:
            return self._queues.ordered(), list(self._running.values())

    def schedule_load(self) -> ScheduleLoad:
        """The budget, the step tokens running requests use, the joins so far and what
        waits per lane (``load.py``: the /metrics gauges)."""
        return self.load_snapshot()[2]

    def load_snapshot(
        self,
    ) -> tuple[list[RequestState], list[RequestState], ScheduleLoad]:
        """``snapshot()`` and ``schedule_load()`` taken together, so a scrape agrees
        with itself (its lanes hold exactly its waiting requests)."""
        now = time.monotonic()
        with self._cond:
            policy = self._queues.policy
            lanes: dict[str, list[float]] = {}
            for lane in self._queues.lanes():
                entry = lanes.setdefault(lane_label(lane.states[0].request), [0, 0, 0])
                entry[0] += len(lane.states)
                entry[1] += sum(policy.cost(s.request) for s in lane.states)
                oldest = now - min(s.arrival for s in lane.states)
                entry[2] = max(entry[2], oldest)
            running = list(self._running.values())
            schedule = ScheduleLoad(
                policy.budget,
                self.max_batch_size,
                sum(policy.step_tokens(s.request) for s in running if not s.finished),
                self._joins,
                tuple(
                    LaneLoad(label, int(n), int(cost), round(max(0.0, wait), 3))
                    for label, (n, cost, wait) in sorted(lanes.items())
                ),
            )
            return self._queues.ordered(), running, schedule

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queues)

    @property
    def num_running(self) -> int:
        with self._cond:
            return len(self._running)
