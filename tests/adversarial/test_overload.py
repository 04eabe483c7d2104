"""Ten times ``server.max_queue`` concurrent valid requests: the excess is refused 429
at once with Retry-After, every admitted request completes, and the queue never grows
past its limit."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from adversarial_helpers import AUTH, GEN, assert_clean_log, generate_ok, metric, scrape

pytestmark = pytest.mark.e2e

MAX_QUEUE = 2  # server.max_queue of the busy server
BURST = 10 * MAX_QUEUE
FAST_REFUSAL_S = 2.0
# Each admitted request runs this many steps: long enough (about a second on 2 cores)
# that the whole burst has arrived while the first admitted ones still run, so the
# excess meets a full queue. More steps only burn CPU.
STEPS = 10


def test_overload_is_refused_fast_and_admitted_requests_complete(busy_server) -> None:
    url = busy_server.url
    # The shape is warm: timings below measure queueing, not first-call setup.
    generate_ok(busy_server)
    depths: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            depths.append(metric(scrape(busy_server), "diffserve_queue_depth"))
            time.sleep(0.01)

    barrier = threading.Barrier(BURST)

    def one(i: int) -> tuple[int, float, httpx.Headers, dict]:
        body = {
            "prompt": f"overload {i}",
            "size": "32x32",
            "num_inference_steps": STEPS,
            "seed": i,
        }
        with httpx.Client(timeout=120) as client:
            barrier.wait()
            start = time.monotonic()
            resp = client.post(url + GEN, json=body, headers=AUTH)
            return resp.status_code, time.monotonic() - start, resp.headers, resp.json()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with ThreadPoolExecutor(BURST) as pool:
            results = list(pool.map(one, range(BURST)))
    finally:
        stop.set()
        sampler.join(timeout=5)
    statuses = sorted(status for status, *_ in results)
    assert set(statuses) <= {200, 429}, statuses
    refused = [
        (elapsed, headers, body)
        for status, elapsed, headers, body in results
        if status == 429
    ]
    admitted = [body for status, _, _, body in results if status == 200]
    # At most a few slip in as others finish.
    assert len(refused) >= BURST - 2 * (MAX_QUEUE + 1), statuses
    assert len(admitted) >= MAX_QUEUE + 1, statuses
    for elapsed, headers, body in refused:
        assert (
            elapsed < FAST_REFUSAL_S
            and headers["retry-after"] == "1"
            and body["error"]["code"] == "queue_full"
        )
    assert all(
        len(body["data"]) == 1 and body["diffserve"]["seeds"] for body in admitted
    )
    assert depths and max(depths) <= MAX_QUEUE, max(depths)
    after = scrape(busy_server)
    assert (
        metric(after, "diffserve_queue_depth") == 0
        and metric(after, "diffserve_inflight_requests") == 0
    )
    assert_clean_log(busy_server)
