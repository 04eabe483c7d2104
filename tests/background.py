"""Run one ``Engine.generate`` on a thread and keep its outcome, for tests that act
while it runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from procs import pid_alive


def generate_in_background(
    engine: Any,
    request: Any,
    *,
    timeout: float | None = None,
    started: threading.Event | None = None,
) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``engine.generate(request)`` on a daemon thread. The returned box gets
    ``out`` or ``error`` and ``done_at`` (monotonic); ``started`` is set at the first
    denoise step."""
    box: dict[str, Any] = {}
    on_progress = (lambda _event: started.set()) if started is not None else None

    def run() -> None:
        try:
            box["out"] = engine.generate(
                request, timeout=timeout, on_progress=on_progress
            )
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            box["error"] = exc
        box["done_at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def generate_together(
    engine: Any, requests: dict[Any, Any], timeout: float = 120
) -> dict[Any, Any]:
    """``engine.generate`` of every request at once, one thread each; their outputs by
    the same keys."""
    outs: dict[Any, Any] = {}
    threads = [
        threading.Thread(
            target=lambda k=k, r=r: outs.__setitem__(k, engine.generate(r))
        )
        for k, r in requests.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    return outs


def wait_until(
    predicate: Callable[[], bool], timeout: float, interval: float = 0.05
) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_gone(pids: list[int], seconds: float) -> bool:
    """Wait up to ``seconds`` for every process of ``pids`` to be gone; True if they all
    are."""
    deadline = time.monotonic() + seconds
    while any(pid_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(pid_alive(pid) for pid in pids)


def kill_mid_request(
    engine: Any, request: Any, pid: int, *, within_s: float = 10.0
) -> dict[str, Any]:
    """The worker-death drill: run ``request`` (long) in the background, SIGKILL ``pid``
    once it has made a denoise step, and check that the request then fails with
    ``EngineDeadError`` within ``within_s``, not a hang. Returns the request's box
    (``error``, ``done_at``) and ``killed_at``."""
    import os
    import signal

    from diffserve.errors import EngineDeadError

    first = threading.Event()
    thread, box = generate_in_background(engine, request, started=first)
    assert first.wait(120), "the long request never made a step"
    box["killed_at"] = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    thread.join(within_s + 20)
    assert not thread.is_alive(), "the request hung after its worker died"
    assert isinstance(box.get("error"), EngineDeadError), box
    assert box["done_at"] - box["killed_at"] < within_s, box
    return box
