"""Step-level batching on the engine side: which waiting requests join a running batch,
and which joins the worker never saw (they reached it after the batch's last step) and
must run in a later batch.

The worker adds joiners at its next step boundary (``Pipeline.run(batch, joins=)``); the
executor polls ``joiner()`` while it waits for the batch. At each poll the room is what
the batch's unfinished requests leave of ``max_batch_size`` and of the step-token budget
(``Scheduler.join_room``), and the scheduler fills it by deficit round robin over the
lanes of the batch's ``step_key`` (``queues.py``: sizes, steps, cache thresholds and
adapters may differ; a large request that does not fit reserves the room until it does;
an oldest waiting request of another ``step_key`` stops joins). Nothing joins while
another replica is idle: an idle replica starts the newcomer at once, on its own cores,
which is better than joining here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffserve.engine.watchdog import batch_deadline_s

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.server_schema import ServerConfig
    from diffserve.engine.replicas import Replica, ReplicaSet
    from diffserve.engine.scheduler import RequestState, Scheduler
    from diffserve.types.request import GenerationRequest


class StepJoins:
    """The joins of one running batch on ``replica``; ``live`` is the batch's request
    list, which grows."""

    def __init__(
        self,
        replica: Replica,
        replicas: ReplicaSet,
        scheduler: Scheduler,
        server: ServerConfig,
        live: list[RequestState],
    ) -> None:
        self.replica, self.replicas, self.scheduler = replica, replicas, scheduler
        self.server = server
        self.live = live
        self.key = scheduler.join_key(live[0].request)
        self.joined: list[RequestState] = []

    def __call__(self) -> tuple[list[GenerationRequest], float]:
        """The requests to add at the worker's next step boundary, and the seconds they
        add to its deadline."""
        room, tokens = self.scheduler.join_room(
            s.request for s in self.live if not s.finished
        )
        if any(
            r is not self.replica and r.heartbeat.state == "idle"
            for r in self.replicas.live()
        ):
            room = 0
        states = (
            self.scheduler.take_joinable(
                self.key, room, self.replica.index, tokens=tokens
            )
            if room > 0
            else []
        )
        if not states:
            return [], 0.0
        self.joined.extend(states)
        self.live.extend(states)
        added = [s.request for s in states]
        return added, batch_deadline_s(added, self.server)

    def late(self, returned: set[str]) -> list[RequestState]:
        """Joins the worker dropped (they arrived after the batch's last step): run them
        in a later batch. ``returned``: the ids of requests that got an output or
        finished otherwise."""
        late = [
            s for s in self.joined if not s.finished and s.request_id not in returned
        ]
        if late:
            self.scheduler.requeue(late)
            self.live[:] = [s for s in self.live if s not in late]
        return late
