"""What a model has still to do, in units a router or an autoscaler can compare across
requests and models.

A request's work is ``steps x megapixels x images`` (times ``frames`` for a video): the
denoiser's cost grows about linearly in each (attention grows faster with the pixels,
and the encoders and the VAE add a share, so this is an estimate, one number per request
that orders them right). A running request's outstanding work is the part of its steps
not yet done (from its last progress event); a waiting one's is all of it.

The queue is the model's (its replicas pull from one queue, so a request waits for the
model, not for a replica); running requests and their work are per replica as well, so a
router can see a hot replica. ``ScheduleLoad`` is the scheduler's side (``queues.py``):
its step-token budget, the tokens its running requests use, its joins, and per lane
(a latent shape) what waits and for how long.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.engine.request_state import RequestState
    from diffserve.types.request import GenerationRequest


def work_units(request: GenerationRequest) -> float:
    """The whole request's work in step-megapixels (x frames for a video); sizes and
    steps are filled at admission, so only an unadmitted request counts 0 for what it
    left unset."""
    megapixels = (request.height or 0) * (request.width or 0) / 1e6
    frames = max(1, request.num_frames or 1)
    return (
        float(request.num_inference_steps or 0)
        * megapixels
        * max(1, request.n)
        * frames
    )


def lane_label(request: GenerationRequest) -> str:
    """The shape a lane is reported under: ``HxW``, or ``HxWxF`` for a clip of F
    frames."""
    label = f"{request.height or 0}x{request.width or 0}"
    return f"{label}x{request.num_frames}" if request.num_frames else label


def outstanding_units(state: RequestState) -> float:
    """What is left of ``state``'s work: all of it while it waits, the steps not yet
    done once it runs."""
    total = work_units(state.request)
    steps = state.request.num_inference_steps or 0
    if state.started is None or steps <= 0:
        return total
    return total * max(0, steps - state.steps_done) / steps


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica: whether it serves, the requests it runs and their outstanding
    work."""

    replica: int
    live: bool
    running: int = 0
    outstanding_work: float = 0.0


@dataclass(frozen=True)
class LaneLoad:
    """The waiting requests of one shape (``lane``: ``HxW``, ``HxWxF`` for a video
    clip of F frames; the lanes of several step or batch keys of one shape summed)."""

    lane: str
    waiting: int = 0
    token_steps: int = 0  # the cost model's work of the waiting requests
    oldest_wait_s: float = 0.0


@dataclass(frozen=True)
class ScheduleLoad:
    """A scheduler's budget and use: ``max_step_tokens`` as resolved (0: no token cap),
    the step tokens of its running requests, the requests joined into running batches
    since start, and its lanes."""

    max_step_tokens: int = 0
    max_batch_size: int = 1
    step_tokens_running: int = 0
    joins: int = 0
    lanes: tuple[LaneLoad, ...] = ()


@dataclass(frozen=True)
class ModelLoad:
    """A model's queue and running requests, in total and per replica (``in_flight`` =
    waiting + running)."""

    queue_depth: int = 0
    running: int = 0
    outstanding_work: float = 0.0
    replicas: tuple[ReplicaLoad, ...] = field(default_factory=tuple)
    schedule: ScheduleLoad = field(default_factory=ScheduleLoad)

    @property
    def in_flight(self) -> int:
        return self.queue_depth + self.running


def model_load(
    waiting: list[RequestState],
    running: list[RequestState],
    live: dict[int, bool],
    schedule: ScheduleLoad | None = None,
) -> ModelLoad:
    """The load of one stage's scheduler (``waiting``, ``running``) over its replicas
    (``live``: index -> serving), with its ``schedule``
    (``Scheduler.schedule_load``)."""
    # Each running request's work read once: its steps advance on the engine thread
    # while this sums, and the model's total must be its replicas' plus the queue's.
    running_work = [(state, outstanding_units(state)) for state in running]
    per_replica = {index: [0, 0.0] for index in live}
    for state, units in running_work:
        if state.replica in per_replica:
            entry = per_replica[state.replica]
            entry[0] += 1
            entry[1] += units
    replicas = tuple(
        ReplicaLoad(index, live[index], int(count), round(float(work), 6))
        for index, (count, work) in sorted(per_replica.items())
    )
    work = sum(outstanding_units(s) for s in waiting) + sum(
        units for _, units in running_work
    )
    return ModelLoad(
        len(waiting),
        len(running),
        round(work, 6),
        replicas,
        schedule if schedule is not None else ScheduleLoad(),
    )
