"""How the engine notices that it cannot serve any more: per-batch deadlines, the loop
heartbeat and the consecutive-failure streak.

A hung worker never answers, so without a deadline its batch (and every request queued
behind it) would wait forever while ``/health`` keeps saying 200. A worker that fails
every batch answers quickly, but with 500s forever; after
``server.max_consecutive_failures`` failed batches in a row the engine declares itself
dead so an orchestrator restarts it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from diffserve.errors import EngineDeadError

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.server_schema import ServerConfig
    from diffserve.types.request import GenerationRequest

# The size of a request no model admitted (an RPC-only executor's): every admitted
# request has its own.
_FALLBACK_SIZE = 1024


def batch_deadline_s(batch: Iterable[GenerationRequest], server: ServerConfig) -> float:
    """Seconds a batch may run before its worker counts as hung.

    ``floor + per_mpix_step * steps * megapixels * images``: the work grows with steps,
    pixels and images (a video's pixels are every frame's), so a fixed timeout would
    either kill honest large batches or wait far too long for small ones. A batch shares
    one ``BatchKey`` (same size and steps), but the sum keeps this correct for any
    batch.
    """
    work = sum(
        (request.num_inference_steps or 0) * work_units([request]) for request in batch
    )
    return (
        float(server.batch_deadline_floor_s)
        + server.batch_deadline_s_per_mpix_step * work
    )


def work_units(requests: Iterable[GenerationRequest]) -> float:
    """What one denoise step of these requests computes, relatively: megapixels x images
    x frames (as admission filled them). The batch deadline and the step heartbeat scale
    by it."""
    return sum(
        (request.height or _FALLBACK_SIZE)
        * (request.width or _FALLBACK_SIZE)
        / 1e6
        * request.n
        * (request.num_frames or 1)
        for request in requests
    )


class Heartbeat:
    """The loop thread's last sign of life: a monotonic timestamp and what the loop was
    doing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = time.monotonic()
        self._state = "idle"

    def beat(self, state: str) -> None:
        with self._lock:
            self._at = time.monotonic()
            self._state = state

    @property
    def age_s(self) -> float:
        with self._lock:
            return max(0.0, time.monotonic() - self._at)

    @property
    def state(self) -> str:
        with self._lock:
            return self._state


class FailureStreak:
    """Counts failed batches in a row; a successful batch resets it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def record(
        self, outcome: str, error: BaseException | None = None
    ) -> EngineDeadError | None:
        """``outcome`` is ``ok``, ``error`` or anything else (aborted, dead: neither
        resets nor counts). Returns the error that kills the engine once the limit is
        reached."""
        if outcome == "ok":
            self.count = 0
        elif outcome == "error":
            self.count += 1
            if self.count >= self.limit:
                last = (
                    f"{type(error).__name__}: {error}"
                    if error is not None
                    else "unknown"
                )
                return EngineDeadError(
                    f"{self.count} consecutive batches failed "
                    f"(server.max_consecutive_failures={self.limit}); last "
                    f"error: {last}"
                )
        return None
