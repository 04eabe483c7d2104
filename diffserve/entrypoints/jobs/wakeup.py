"""How a background loop (the job runner, the webhook dispatcher) sleeps: until it is
woken or its poll interval passes."""

from __future__ import annotations

import asyncio
import contextlib


async def wait_awake(wake: asyncio.Event, timeout_s: float) -> None:
    """Until ``wake`` is set or ``timeout_s`` passes, then clear it.
    ``asyncio.timeout``, not ``asyncio.wait_for``: Python 3.11's ``wait_for`` returns
    normally when its task is cancelled just as the event is set, swallowing the
    cancellation, so a loop told to stop would go on forever (CPython gh-86296)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await wake.wait()
    wake.clear()
