"""Two instances delivering one job store's webhook outbox (PostgreSQL, a real server
from tests/pg_server.py, and SQLite): two dispatchers race for every event, and each
attempt is made exactly once; many claims of one event read at once: one wins."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from test_webhooks import SECRET, attach, config, finish, settled
from webhook_receiver import receiver, verified

from diffserve.entrypoints.jobs.outbox import DELIVERED
from diffserve.entrypoints.jobs.store import JobStore

EVENTS = 24


def test_two_instances_make_every_attempt_exactly_once(url: str) -> None:
    with receiver() as hooks:
        one, two = JobStore(url), JobStore(url)
        settings = config(hooks, endpoints=(hooks.url + "/all",))
        first = attach(one, settings, owner="one")
        second = attach(two, settings, owner="two")

        async def scenario() -> list:
            await first.start()
            await second.start()
            try:
                # Half the jobs finish on each instance; both deliver from the start.
                jobs = [
                    await asyncio.to_thread(finish, one if i % 2 else two)
                    for i in range(EVENTS)
                ]
                rows = []
                for job_id in jobs:
                    rows += await settled(first, job_id)
                return rows
            finally:
                await first.stop()
                await second.stop()

        rows = asyncio.run(asyncio.wait_for(scenario(), 60))
        assert len(rows) == EVENTS
        assert all(r.status == DELIVERED and r.attempts == 1 for r in rows)
        # One request per event: no attempt was made twice.
        assert Counter(hooks.ids()) == Counter({r.id: 1 for r in rows})
        for delivery in hooks.deliveries:
            verified(delivery, SECRET)
        one.close()
        two.close()


def test_of_many_claims_of_one_attempt_one_wins(url: str) -> None:
    with receiver() as hooks:
        stores = [JobStore(url) for _ in range(4)]
        outboxes = [
            attach(s, config(hooks), owner=f"i{n}").outbox for n, s in enumerate(stores)
        ]
        finish(stores[0])
        (event,) = outboxes[0].due(now=time.time(), limit=10)
        with ThreadPoolExecutor(4) as pool:
            claims = list(
                pool.map(
                    lambda box: box.claim(event, "x", now=time.time(), claim_s=30),
                    outboxes * 3,
                )
            )
        assert sum(c is not None for c in claims) == 1
        for s in stores:
            s.close()
