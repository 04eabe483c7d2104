"""The step heartbeat's arithmetic (``engine/step_watch.py``): each phase's pace is
learned per unit of work, the limit is max(10 s, 5 x the expected time for the work now
live), a phase without history has none, and neither has the lead phase of a compiled
replica."""

from __future__ import annotations

import pytest

from diffserve.engine import step_watch
from diffserve.engine.step_watch import STALL_FLOOR_S, StepPace, StepWatch
from diffserve.engine.watchdog import work_units
from diffserve.types.request import GenerationRequest


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(step_watch.time, "monotonic", fake)
    return fake


def test_work_counts_pixels_images_and_frames() -> None:
    image = GenerationRequest(prompt="a", height=512, width=512, n=2)
    video = GenerationRequest(prompt="a", height=64, width=64, num_frames=17)
    assert work_units([image]) == pytest.approx(2 * 0.262144)
    assert work_units([video, GenerationRequest(prompt="b")]) == pytest.approx(
        17 * 0.004096 + 1.048576
    )


def test_a_stall_is_found_after_five_times_the_learned_pace_and_never_before_the_floor(
    clock: Clock,
) -> None:
    pace, work = StepPace(), [1.0]
    first = StepWatch(pace, lambda: work[0], compiled=False)
    clock.now += 500.0
    assert first.stalled() is None  # no history: only the batch deadline bounds it
    for step in (1, 2, 3):  # lead 500 s (a cold start), steps of 4 s, then the tail
        first.stepped(step, 3)
        clock.now += 4.0
    first.finished()

    second = StepWatch(pace, lambda: work[0], compiled=False)
    second.stepped(1, 3)
    clock.now += 19.9
    assert second.stalled() is None  # 5 x 4 s
    clock.now += 0.2
    assert "made no progress for 20.1s in its step phase" in second.stalled()

    joined = StepWatch(pace, lambda: work[0], compiled=False)
    joined.stepped(1, 3)
    work[0] = 4.0  # a join made the batch four times the work: the limit grows with it
    clock.now += 79.0
    assert joined.stalled() is None
    clock.now += 2.0
    assert joined.stalled() is not None


def test_fast_paces_keep_the_floor_and_compiled_replicas_skip_the_lead(
    clock: Clock,
) -> None:
    pace = StepPace()
    learner = StepWatch(pace, lambda: 1.0, compiled=True)
    clock.now += 0.01
    learner.stepped(1, 1)
    clock.now += 0.01
    learner.finished()
    compiled = StepWatch(pace, lambda: 1.0, compiled=True)
    clock.now += 3600.0
    assert compiled.stalled() is None  # a new shape may compile in the lead phase
    eager = StepWatch(pace, lambda: 1.0, compiled=False)
    clock.now += STALL_FLOOR_S - 0.1
    assert eager.stalled() is None  # 5 x 0.01 s is below the floor
    clock.now += 0.2
    assert "lead phase" in eager.stalled()
