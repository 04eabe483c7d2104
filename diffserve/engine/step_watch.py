"""The step heartbeat: a worker that stops reporting denoise steps is found within
``max(10 s, 5 x`` the time its replica has been taking for that much work ``)``, instead
of at the batch deadline's floor (minutes).

A running batch reports progress at every denoise step. Between two reports the replica
does one phase: ``lead`` (the call's start to its first step: text encoding and the
first step), ``step`` (one denoise step) or ``tail`` (the last step to the result:
decoding). ``StepPace`` learns, per replica and phase, the seconds each phase takes per
unit of work (``watchdog.work_units``: megapixels x images x frames of the live
requests), as a running average; ``StepWatch`` turns that into a limit for the gap the
batch is in now. A phase with no history yet has no limit (the batch deadline still
bounds it), and neither has ``lead`` on a compiled replica: a new shape may compile
there, for minutes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

STALL_FLOOR_S = 10.0
STALL_FACTOR = 5.0
_SMOOTHING = 0.3  # weight of the newest gap in the running average
PHASES = ("lead", "step", "tail")


class StepPace:
    """Seconds per work unit of each phase on one replica (thread-safe: steps arrive on
    reader threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._per_unit: dict[str, float] = {}

    def observe(self, phase: str, seconds: float, work: float) -> None:
        with self._lock:
            value = seconds / max(work, 1e-6)
            previous = self._per_unit.get(phase)
            self._per_unit[phase] = (
                value
                if previous is None
                else (1 - _SMOOTHING) * previous + _SMOOTHING * value
            )

    def expected_s(self, phase: str, work: float) -> float | None:
        with self._lock:
            per_unit = self._per_unit.get(phase)
        return None if per_unit is None else per_unit * work


class StepWatch:
    """One batch's gaps between progress reports, learned into ``pace`` and checked
    against it."""

    def __init__(
        self, pace: StepPace, work: Callable[[], float], *, compiled: bool
    ) -> None:
        self.pace = pace
        self.work = work
        self.compiled = compiled
        self._lock = threading.Lock()
        self._phase = "lead"
        self._since = time.monotonic()
        self.reason: str | None = None  # why ``stalled`` last said the worker is hung

    def stepped(self, step: int, total: int) -> None:
        """A step was reported: the gap that ended is learned; the next is ``step`` or,
        after the last, ``tail``."""
        now = time.monotonic()
        with self._lock:
            self.pace.observe(self._phase, now - self._since, self.work())
            self._phase = "tail" if step >= total else "step"
            self._since = now

    def finished(self) -> None:
        """The batch returned: its tail is learned."""
        with self._lock:
            if self._phase == "tail":
                self.pace.observe("tail", time.monotonic() - self._since, self.work())

    def stalled(self) -> str | None:
        """Why the worker counts as hung now (no report within the limit), or None."""
        with self._lock:
            phase, waited = self._phase, time.monotonic() - self._since
        if phase == "lead" and self.compiled:
            return None
        expected = self.pace.expected_s(phase, self.work())
        if expected is None:
            return None
        limit = max(STALL_FLOOR_S, STALL_FACTOR * expected)
        if waited <= limit:
            return None
        self.reason = (
            f"made no progress for {waited:.1f}s in its {phase} "
            f"phase (limit max({STALL_FLOOR_S:g}s, "
            f"{STALL_FACTOR:g} x {expected:.2f}s, the time this "
            "replica has been taking for it))"
        )
        return self.reason
