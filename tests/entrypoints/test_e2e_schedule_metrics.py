"""The scheduler's /metrics over a real server (tiny FLUX, step-level batches of two):
the step-token budget and its use, the joins counter, and per lane (latent shape) the
requests and token-steps waiting and the oldest wait."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

MODEL = "tiny-flux"
STEPS = 24  # long enough that the later requests arrive while the first one runs
DEPLOY = """
max_batch_size: 2
batching: step
enforce_eager: true
"""


@pytest.fixture(scope="module")
def server(server_launcher, write_deploy, tiny_flux_dir) -> Any:
    with server_launcher(
        tiny_flux_dir,
        "--deploy-config",
        write_deploy(DEPLOY),
        "--served-model-name",
        MODEL,
    ) as proc:
        yield proc


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def model(samples: dict, name: str) -> float:
    return samples[(name, (("model", MODEL),))]


def lane(samples: dict, name: str, shape: str) -> float | None:
    return samples.get((name, (("lane", shape), ("model", MODEL))))


def test_budget_use_joins_and_lanes(server) -> None:
    idle = scrape(server.url)
    budget = model(idle, "diffserve_model_max_step_tokens")
    # Auto: two default requests (tiny FLUX: 128x128) a step.
    assert budget > 0 and model(idle, "diffserve_model_max_batch_size") == 2
    assert model(idle, "diffserve_model_step_tokens_running") == 0
    joins_before = model(idle, "diffserve_model_step_joins_total")
    assert not [key for key in idle if key[0].startswith("diffserve_lane_")]

    statuses: list[int] = []

    def post(size: int, seed: int) -> None:
        reply = httpx.post(
            server.url + "/v1/images/generations",
            json={
                "prompt": "a fox",
                "size": f"{size}x{size}",
                "num_inference_steps": STEPS,
                "seed": seed,
                "model": MODEL,
            },
            timeout=300,
        )
        statuses.append(reply.status_code)

    def start(size: int, seed: int) -> threading.Thread:
        thread = threading.Thread(target=post, args=(size, seed))
        thread.start()
        return thread

    threads = [start(128, 1)]
    deadline = time.monotonic() + 60
    while model(scrape(server.url), "diffserve_model_requests_running") < 1:
        assert time.monotonic() < deadline, "the first request never ran"
        time.sleep(0.02)
    large = model(scrape(server.url), "diffserve_model_step_tokens_running")
    # One default request: half the automatic budget.
    assert large == budget / 2
    # A 64x64 request joins the 128x128 one (another lane, room for its tokens); the
    # other waits in the 64x64 lane (the batch has its two requests) until the first
    # one leaves.
    threads += [start(64, 2), start(64, 3)]
    seen = None
    while any(t.is_alive() for t in threads):
        sample = scrape(server.url)
        if lane(sample, "diffserve_lane_waiting_requests", "64x64") == 1:
            seen = sample
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    assert statuses == [200, 200, 200]
    assert seen is not None, "never saw a request waiting in the 64x64 lane"
    small = large / 4
    assert model(seen, "diffserve_model_requests_running") == 2
    assert model(seen, "diffserve_model_step_tokens_running") == large + small
    assert lane(seen, "diffserve_lane_waiting_token_steps", "64x64") == small * STEPS
    assert (lane(seen, "diffserve_lane_oldest_wait_seconds", "64x64") or 0) > 0

    done = scrape(server.url)
    # The second request joined the first's batch, the third joined once one left.
    assert model(done, "diffserve_model_step_joins_total") - joins_before == 2
    assert model(done, "diffserve_model_step_tokens_running") == 0
    assert not [key for key in done if key[0].startswith("diffserve_lane_")]
