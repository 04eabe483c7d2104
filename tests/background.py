"""Run one ``Engine.generate`` on a thread and keep its outcome, for tests that act while it runs."""

from __future__ import annotations

import threading
import time
from typing import Any


def generate_in_background(engine: Any, request: Any, *, timeout: float | None = None,
                           started: threading.Event | None = None) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``engine.generate(request)`` on a daemon thread. The returned box gets ``out`` or ``error``
    and ``done_at`` (monotonic); ``started`` is set at the first denoise step."""
    box: dict[str, Any] = {}
    on_progress = (lambda _event: started.set()) if started is not None else None

    def run() -> None:
        try:
            box["out"] = engine.generate(request, timeout=timeout, on_progress=on_progress)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            box["error"] = exc
        box["done_at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box
