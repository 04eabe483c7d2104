"""The waiting requests of one stage, in lanes served by deficit round robin (DRR).

Lanes. A request waits in the lane of its shape (``SchedulePolicy.lane_key``): on a
step-level stage ``(step_key, group_key)``, on a request-level one the full
``batch_key``. Within a lane requests keep their arrival order. Lanes that may share a
batch form a ring (``ring_key``: one ``step_key``; a request-level stage has one ring
and still takes a batch from one lane).

DRR. A ring's lanes take turns in order; a lane that becomes non-empty joins at the
tail (it waits a round). A turn adds the quantum to the lane's deficit, and the lane
serves while its head's cost (token-steps, ``PipelineCapabilities.cost``) is at most
its deficit, each request served taking its cost off. A head that costs more ends the
turn and the lane keeps its deficit for the next one; a lane that empties leaves the
ring and its deficit goes back to 0. Over time every backlogged lane of a ring gets the
same token-steps per round, whatever its requests cost, and a lane of huge requests
saves up until its head is paid for. A turn is a state of the ring, not of one call: a
lane that still has deficit when its batch is full keeps the turn, and goes on serving
at the next step boundary (joins) or in the next batch.

Room. A batch holds at most ``max_batch_size`` requests and ``budget`` step tokens
(the sum of ``step_tokens`` of its unfinished requests). The first request of a new
batch always fits: a request above the budget runs, alone.

Reservation. When the turn's lane has a head it can pay for that does not fit the
room, the lane keeps the turn and nothing else joins the ring's batches until the room
fits that head (requests finish, their tokens free up). Without this, a stream of small
requests would refill every freed token before a large one ever saw enough room, and the
large one would wait forever; with it, the large request joins within the steps it takes
the running requests to free its tokens (or, larger than the budget, starts the next
batch once the running one drains).

No starvation, in short: within a ring DRR visits every lane each round and
reservation turns a lane's paid-for turn into a bounded wait for room; across rings,
joins stop as soon as the oldest waiting request belongs to another ring, and a
step-level ``next_batch`` takes the ring of the oldest waiting request, so that request
waits at most for the running batch's remaining steps.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diffserve.engine.policy import SchedulePolicy

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.engine.request_state import RequestState


@dataclass
class Room:
    """What a batch can still take: requests (``count``) and step tokens (``tokens``;
    None: no token cap). ``empty``: a new batch, whose first request always fits."""

    count: int
    tokens: int | None = None
    empty: bool = False

    @property
    def open(self) -> bool:
        return self.count > 0 and (self.empty or self.tokens is None or self.tokens > 0)

    def fits(self, tokens: int) -> bool:
        if self.count < 1:
            return False
        return self.empty or self.tokens is None or tokens <= self.tokens

    def take(self, tokens: int) -> None:
        self.count -= 1
        self.empty = False
        if self.tokens is not None:
            self.tokens -= tokens


@dataclass(eq=False)
class Lane:
    """The waiting requests of one shape, oldest first, and their DRR deficit."""

    key: Hashable
    ring: Hashable
    states: deque[RequestState] = field(default_factory=deque)
    deficit: int = 0


@dataclass(eq=False)
class Ring:
    """Lanes that take turns, ``turn`` the index of the lane whose turn it is (or is
    next, when ``in_turn`` is false). ``misses``: turns in a row that served nothing
    because the head cost more than the deficit."""

    lanes: list[Lane] = field(default_factory=list)
    turn: int = 0
    in_turn: bool = False
    misses: int = 0

    @property
    def current(self) -> Lane:
        return self.lanes[self.turn]

    def end_turn(self) -> None:
        self.in_turn = False
        self.turn = (self.turn + 1) % len(self.lanes)

    def insert(self, lane: Lane, *, first: bool = False) -> None:
        """A lane that became non-empty: at the tail of the round (just before the lane
        whose turn it is), or ``first``: next to get a turn (requests put back)."""
        self.misses = 0
        if first:
            self.lanes.insert(self.turn + 1 if self.in_turn else self.turn, lane)
            return
        self.lanes.insert(self.turn, lane)
        if len(self.lanes) > 1:
            self.turn += 1

    def remove(self, lane: Lane) -> None:
        self.misses = 0
        index = self.lanes.index(lane)
        del self.lanes[index]
        if index < self.turn:
            self.turn -= 1
        elif index == self.turn:
            self.in_turn = False  # the turn passes to the lane that took its place
        if self.turn >= len(self.lanes):
            self.turn = 0


class LaneQueues:
    """The lanes and rings of one scheduler (not thread-safe: the scheduler holds its
    lock around every call)."""

    def __init__(self, max_batch_size: int, policy: SchedulePolicy) -> None:
        self.max_batch_size = max_batch_size
        self.policy = policy
        self._lanes: dict[Hashable, Lane] = {}
        self._rings: dict[Hashable, Ring] = {}
        self._where: dict[str, Lane] = {}  # request_id -> its lane
        # Arrival order across lanes (``RequestState.seq``): arrivals count up, requests
        # put back at the head count down, below every arrival.
        self._arrivals = itertools.count(1)
        self._front = 0

    @property
    def quantum(self) -> int:
        return max(1, self.policy.quantum or self.max_batch_size)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._where

    def lanes(self) -> Iterator[Lane]:
        return iter(self._lanes.values())

    def reconfigure(self, policy: SchedulePolicy) -> None:
        """A new policy (the capabilities became known): re-lane whatever waits, in
        arrival order, with fresh deficits."""
        waiting = self.ordered()
        self.policy = policy
        self._lanes, self._rings, self._where = {}, {}, {}
        for state in waiting:
            self._insert(state, first=False)

    # -- arrivals and removals
    # ------------------------------------------------------------------------------

    def push(self, state: RequestState) -> None:
        state.seq = next(self._arrivals)
        self._insert(state, first=False)

    def push_front(self, states: list[RequestState]) -> None:
        """Put ``states`` back ahead of every waiting request, in their order."""
        for state in reversed(states):
            self._front -= 1
            state.seq = self._front
            self._insert(state, first=True)

    def _insert(self, state: RequestState, *, first: bool) -> None:
        key = self.policy.lane_key(state.request)
        lane = self._lanes.get(key)
        if lane is None:
            ring_key = self.policy.ring_key(state.request)
            lane = self._lanes[key] = Lane(key, ring_key)
            self._rings.setdefault(ring_key, Ring()).insert(lane, first=first)
        if first:
            lane.states.appendleft(state)  # put back: ahead of its lane
        else:
            lane.states.append(state)
        self._where[state.request_id] = lane

    def remove(self, request_id: str) -> RequestState | None:
        """Take a waiting request out wherever it is in its lane (an abort)."""
        lane = self._where.pop(request_id, None)
        if lane is None:
            return None
        state = next(s for s in lane.states if s.request_id == request_id)
        lane.states.remove(state)
        if not lane.states:
            self._drop(lane)
        return state

    def pop_all(self) -> list[RequestState]:
        waiting = self.ordered()
        self._lanes, self._rings, self._where = {}, {}, {}
        return waiting

    def _pop_head(self, lane: Lane) -> RequestState:
        state = lane.states.popleft()
        del self._where[state.request_id]
        if not lane.states:
            self._drop(lane)
        return state

    def _drop(self, lane: Lane) -> None:
        """An empty lane leaves its ring; its deficit goes back to 0 (DRR)."""
        lane.deficit = 0
        del self._lanes[lane.key]
        ring = self._rings[lane.ring]
        ring.remove(lane)
        if not ring.lanes:
            del self._rings[lane.ring]

    # -- order
    # ------------------------------------------------------------------------------

    def ordered(self) -> list[RequestState]:
        """Every waiting request, oldest first."""
        return sorted(
            (s for lane in self._lanes.values() for s in lane.states),
            key=lambda s: s.seq,
        )

    def oldest(self) -> RequestState | None:
        heads = (lane.states[0] for lane in self._lanes.values())
        return min(heads, key=lambda s: s.seq, default=None)

    def take_oldest(
        self, room: Room, lane_key: Hashable | None = None
    ) -> list[RequestState]:
        """The oldest requests while they fit ``room`` (and, given ``lane_key``, while
        the oldest is of that lane): FIFO across lanes, for the AR stages, which batch
        any prompts, and for joins into a request-level batch."""
        taken: list[RequestState] = []
        while room.open:
            head = self.oldest()
            if head is None:
                break
            lane = self._where[head.request_id]
            tokens = self.policy.step_tokens(head.request)
            if (lane_key is not None and lane.key != lane_key) or not room.fits(tokens):
                break
            lane.deficit = max(0, lane.deficit - self.policy.cost(head.request))
            taken.append(self._pop_head(lane))
            room.take(tokens)
        return taken

    # -- deficit round robin
    # ------------------------------------------------------------------------------

    def next_batch(self) -> list[RequestState]:
        """A new batch: on a step-level stage the ring of the oldest waiting request,
        filled across its lanes; on a request-level one, one lane's requests."""
        oldest = self.oldest()
        if oldest is None:
            return []
        step_level = self.policy.step_level
        ring = self._rings[self.policy.ring_key(oldest.request)]
        room = Room(self.max_batch_size, self.policy.budget or None, empty=True)
        return self._fill(ring, room, one_lane=not step_level)

    def joins(self, ring_key: Hashable, room: Room) -> list[RequestState]:
        """Requests for a running step-level batch of ``ring_key`` at a step boundary:
        none while the oldest waiting request is of another ring (it goes next, once
        this batch drains), else the ring's DRR into ``room``."""
        oldest = self.oldest()
        if oldest is None or self.policy.ring_key(oldest.request) != ring_key:
            return []
        ring = self._rings.get(ring_key)
        return self._fill(ring, room, one_lane=False) if ring is not None else []

    def _fill(self, ring: Ring, room: Room, *, one_lane: bool) -> list[RequestState]:
        taken: list[RequestState] = []
        first: Lane | None = None
        while ring.lanes and room.open:
            lane = ring.current
            if one_lane and first is not None and lane is not first:
                break
            if not ring.in_turn:
                ring.in_turn = True
                lane.deficit += self.quantum
            head = lane.states[0]
            cost = self._cost(head)
            if cost > lane.deficit:
                ring.end_turn()
                ring.misses += 1
                if ring.misses >= len(ring.lanes):
                    self._skip_idle_rounds(ring)
                continue
            tokens = self.policy.step_tokens(head.request)
            if not room.fits(tokens):
                break  # reserved: the lane keeps its turn until the room fits its head
            lane.deficit -= cost
            ring.misses = 0
            first = first or lane
            taken.append(self._pop_head(lane))
            room.take(tokens)
        return taken

    def _cost(self, state: RequestState) -> int:
        return self.policy.cost(state.request)

    def _skip_idle_rounds(self, ring: Ring) -> None:
        """A whole round served nothing (every head costs more than its lane's
        deficit): give every lane the quanta of the rounds that would serve nothing
        either, at once, instead of turning round after round."""
        quantum = self.quantum
        rounds = min(
            -(-(self._cost(lane.states[0]) - lane.deficit) // quantum)
            for lane in ring.lanes
        )
        if rounds > 1:
            for lane in ring.lanes:
                lane.deficit += (rounds - 1) * quantum
        ring.misses = 0
