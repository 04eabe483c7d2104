"""What the engine reports after every executed batch (warmup excluded), for metrics and
tests."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BatchStats:
    """One executed batch. ``outcome`` is ``ok``, ``aborted`` or ``error``; ``kernels``
    is the worker's attestation snapshot (linear/attention calls per backend,
    transformer forwards) for the batch."""

    executor: str
    batch_size: int
    images: int
    request_ids: tuple[str, ...]
    queue_ms: tuple[float, ...]
    batch_ms: float
    outcome: str
    phase_ms: dict[str, float] = field(default_factory=dict)
    kernels: dict[str, Any] = field(default_factory=dict)
    replica: int = 0  # which replica ran it (``num_replicas``)


@dataclass
class EngineCounters:
    """Cumulative totals since start (warmup never counted)."""

    requests_ok: int = 0
    requests_failed: int = 0
    requests_aborted: int = 0
    batches: int = 0
    images: int = 0
    # The most recent batch sizes (bounded: a long-running server must not grow it
    # forever).
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=1000))

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "requests_aborted": self.requests_aborted,
            "batches": self.batches,
            "images": self.images,
            "batch_sizes": list(self.batch_sizes),
        }


def kernel_delta(kernels: dict[str, Any], counted: dict[str, Any]) -> dict[str, Any]:
    """``kernels - counted`` for snapshot-shaped kernel tallies (per-backend dicts and
    plain counts)."""
    out: dict[str, Any] = {}
    for key, value in kernels.items():
        before = counted.get(key)
        if isinstance(value, dict):
            out[key] = {
                name: calls - (before or {}).get(name, 0)
                for name, calls in value.items()
            }
        elif isinstance(value, int) and isinstance(before, int):
            out[key] = value - before
        else:
            out[key] = value
    return out
