"""``GET /metrics`` parses as Prometheus text and moves by exactly what the requests
did."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

GEN = "/v1/images/generations"


@pytest.fixture(scope="module")
def server(uni_server):
    return uni_server


def scrape(server) -> dict[tuple[str, tuple], float]:
    resp = httpx.get(server.url + "/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith(
        "text/plain"
    )
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_move_by_the_right_amounts(server, client) -> None:
    before = scrape(server)
    result = client.images.generate(
        prompt="a fox",
        size="64x64",
        n=2,
        extra_body={"num_inference_steps": 2, "seed": 3},
    )
    with pytest.raises(openai.BadRequestError):
        client.images.generate(prompt="a fox", size="65x64")
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("diffserve_http_requests_total", endpoint=GEN, status="200") == 1
    assert delta("diffserve_http_requests_total", endpoint=GEN, status="400") == 1
    assert delta("diffserve_http_request_duration_seconds_count", endpoint=GEN) == 2
    assert delta("diffserve_images_generated_total") == 2
    assert delta("diffserve_batches_total", outcome="ok") == 1
    assert (
        delta("diffserve_batch_size_count") == 1
        and delta("diffserve_batch_size_sum") == 1
    )
    for phase in ("queue", "denoise", "decode", "total", "image_encode"):
        assert delta("diffserve_request_phase_seconds_count", phase=phase) == 1, phase
    attestation = result.model_extra["diffserve"]["attestation"]
    for kind in ("linear", "attention"):
        assert attestation[kind], attestation
        for backend, calls in attestation[kind].items():
            assert (
                delta("diffserve_kernel_calls_total", kind=kind, backend=backend)
                == calls
            ), (kind, backend)
    assert value(after, "diffserve_queue_depth") == 0
    assert value(after, "diffserve_engine_ready") == 1
    assert value(after, "diffserve_inflight_requests") == 0


def test_client_disconnect_aborts_the_request(server) -> None:
    before = scrape(server)
    body = {
        "prompt": "long",
        "size": "256x256",
        "num_inference_steps": 1000,
        "stream": True,
    }
    with httpx.stream(
        "POST", server.url + GEN, headers=server.auth, json=body, timeout=120
    ) as resp:
        progress = [
            line
            for _, line in zip(
                range(2),
                (ln for ln in resp.iter_lines() if ln.startswith("data:")),
                strict=False,
            )
        ]
        assert len(progress) == 2
    # Leaving the block closed the connection: the engine stops the batch at its next
    # step.
    deadline = time.monotonic() + 30
    while value(scrape(server), "diffserve_batches_total", outcome="aborted") <= value(
        before, "diffserve_batches_total", outcome="aborted"
    ):
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.05)
    assert value(scrape(server), "diffserve_images_generated_total") == value(
        before, "diffserve_images_generated_total"
    )


def test_conditioning_cache_hits_misses_and_bytes(server, client) -> None:
    """The same prompt twice: a miss then a hit (the same image), each counted; a
    request may opt out."""
    # Never seen by this server before.
    prompt = f"a conditioning cache fox {time.time_ns()}"
    before = scrape(server)

    def generate(**extra):
        return client.images.generate(
            prompt=prompt,
            size="64x64",
            extra_body={"num_inference_steps": 2, "seed": 5, **extra},
        )

    first, second, fresh = generate(), generate(), generate(conditioning_cache=False)
    after = scrape(server)
    outcomes = [
        r.model_extra["diffserve"]["attestation"]["conditioning_cache"]
        for r in (first, second, fresh)
    ]
    assert outcomes == ["miss", "hit", "off"]
    assert first.data[0].b64_json == second.data[0].b64_json == fresh.data[0].b64_json
    assert (
        value(after, "diffserve_conditioning_cache_hits_total", replica="0")
        - value(before, "diffserve_conditioning_cache_hits_total", replica="0")
        == 1
    )
    assert (
        value(after, "diffserve_conditioning_cache_misses_total", replica="0")
        - value(before, "diffserve_conditioning_cache_misses_total", replica="0")
        == 1
    )
    state = second.model_extra["diffserve"]["attestation"]["conditioning_cache_state"]
    assert (
        value(after, "diffserve_conditioning_cache_bytes", replica="0")
        == state["bytes"]
        > 0
    )
