"""The result of one measurement, and the guard that turns a missing or broken piece
into a row that says so instead of a crashed run."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Section:
    """One measurement's table. ``metrics`` holds the numbers the targets table reads
    (by key)."""

    key: str
    title: str
    status: str = "ok"  # "ok" | "not available" | "failed"
    reason: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, *row: Any) -> None:
        self.rows.append(list(row))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Unavailable(Exception):
    """Raised by a measurement that cannot run here: an optional contender is not
    installed (cache-dit), or the case does not fit the measurement (e.g. a size Ulysses
    cannot shard)."""


def guarded(key: str, title: str, fn: Callable[[Section], None]) -> Section:
    """Run ``fn`` on a fresh Section. ImportError/Unavailable -> "not available"; any
    other error -> "failed" with the exception, keeping whatever rows were measured
    before it."""
    section = Section(key=key, title=title)
    t0 = time.perf_counter()
    print(f"[bench] {title} ...", flush=True)
    try:
        fn(section)
    except (ImportError, Unavailable) as exc:
        section.status, section.reason = "not available", f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - one broken measurement must not lose the others
        section.status = "failed"
        section.reason = f"{type(exc).__name__}: {exc}"
        section.notes.append(
            "traceback tail: "
            + " | ".join(traceback.format_exc().strip().splitlines()[-4:])
        )
    section.seconds = round(time.perf_counter() - t0, 1)
    print(
        f"[bench] {title}: {section.status} {section.reason} ({section.seconds}s)",
        flush=True,
    )
    return section
