"""Soak (``-m slow`` or ``DIFFSERVE_SOAK=1``): a few thousand mixed requests (n 1-2,
b64/url, SSE, some invalid). After a warm-up, RSS, open fds, threads and the number of
metric series stay flat."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from adversarial_helpers import AUTH, GEN, assert_clean_log, open_fds, rss_mib, threads

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WARMUP = 200
REQUESTS = 3000
# After warm-up; the url store is bounded (TTL, 256 MiB) and small here.
RSS_GROWTH_LIMIT_MIB = 64
FD_GROWTH_LIMIT = 16
THREAD_GROWTH_LIMIT = 4


def one(client: httpx.Client, i: int) -> int:
    rng = random.Random(i)
    body = {
        "prompt": f"soak {i}",
        "size": rng.choice(["32x32", "64x32"]),
        "num_inference_steps": 1,
        "n": rng.randint(1, 2),
        "response_format": rng.choice(["b64_json", "url"]),
    }
    kind = i % 4
    if kind == 3:
        body["guidance_scale"] = "bad"
    if kind == 2:
        with client.stream(
            "POST", GEN, json={**body, "stream": True}, headers=AUTH
        ) as resp:
            for _ in resp.iter_lines():
                pass
            return resp.status_code
    return client.post(GEN, json=body, headers=AUTH).status_code


def run(server, count: int, offset: int) -> list[int]:
    with (
        httpx.Client(
            base_url=server.url, timeout=120, limits=httpx.Limits(max_connections=3)
        ) as client,
        ThreadPoolExecutor(3) as pool,
    ):
        return list(pool.map(lambda i: one(client, i), range(offset, offset + count)))


def series(server) -> int:
    # The first scrape itself adds the /metrics endpoint's series.
    httpx.get(server.url + "/metrics")
    text = httpx.get(server.url + "/metrics").text
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def test_soak_resources_stay_flat(hardened_server) -> None:
    # Warm-up, then a first half that lets every bounded label value appear once
    # (statuses such as 429 only show up under load); the second half must add nothing.
    run(hardened_server, WARMUP, 0)
    statuses = run(hardened_server, REQUESTS // 2, WARMUP)
    before = (
        rss_mib(hardened_server),
        open_fds(hardened_server),
        threads(hardened_server),
        series(hardened_server),
    )
    statuses += run(hardened_server, REQUESTS // 2, WARMUP + REQUESTS // 2)
    assert set(statuses) <= {200, 400, 429}, sorted(set(statuses))
    after = (
        rss_mib(hardened_server),
        open_fds(hardened_server),
        threads(hardened_server),
        series(hardened_server),
    )
    assert after[0] - before[0] < RSS_GROWTH_LIMIT_MIB, (before, after)
    assert after[1] - before[1] <= FD_GROWTH_LIMIT, (before, after)
    assert after[2] - before[2] <= THREAD_GROWTH_LIMIT, (before, after)
    assert after[3] == before[3], (before, after)  # no new label values: bounded series
    assert_clean_log(hardened_server)
