"""The background loops' sleep (jobs/wakeup.py): woken early, timed out otherwise, and
a loop cancelled in the very turn it is woken still stops (``asyncio.wait_for`` on
Python 3.11 swallows that cancellation: a dispatcher's stop hung on it in CI)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from diffserve.entrypoints.jobs.wakeup import wait_awake

Sleep = Callable[[asyncio.Event], Awaitable[None]]


async def with_wait_awake(wake: asyncio.Event) -> None:
    await wait_awake(wake, 0.05)


async def stops_when_cancelled_as_woken(sleep: Sleep) -> bool:
    wake = asyncio.Event()

    async def loop() -> None:
        while True:
            await sleep(wake)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    wake.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=1.0)
    if not done:
        task.cancel()  # the loop went on: stop it for good
        await asyncio.gather(task, return_exceptions=True)
    return bool(done)


def test_a_loop_cancelled_as_it_is_woken_stops() -> None:
    async def main() -> list[bool]:
        return [await stops_when_cancelled_as_woken(with_wait_awake) for _ in range(5)]

    assert all(asyncio.run(main()))


def test_it_wakes_early_or_times_out_and_clears_the_event() -> None:
    async def main() -> tuple[float, float, bool]:
        wake = asyncio.Event()
        start = time.monotonic()
        await wait_awake(wake, 0.2)
        slept = time.monotonic() - start
        asyncio.get_running_loop().call_later(0.02, wake.set)
        start = time.monotonic()
        await wait_awake(wake, 5.0)
        return slept, time.monotonic() - start, wake.is_set()

    slept, woken, still_set = asyncio.run(main())
    assert 0.15 <= slept < 2.0 and woken < 1.0 and not still_set
