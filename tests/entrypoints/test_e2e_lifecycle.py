"""Readiness and death on an ``mp`` server: 503 while loading, 200 once warmed, 503 once
its worker is killed, and the HTTP server itself keeps answering throughout."""

from __future__ import annotations

import os
import signal
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

# The worker process (spawn + torch import + load + warmup) takes seconds to come up,
# while the HTTP server answers /health within milliseconds: the not-ready window is
# wide.
DEPLOY = """
distributed_executor_backend: mp
enforce_eager: true
warmup:
  enabled: true
  height: 128
  width: 128
  steps: 1
"""


@pytest.fixture(scope="module")
def server(server_launcher, write_deploy, tiny_flux_dir):
    with server_launcher(
        tiny_flux_dir, "--deploy-config", write_deploy(DEPLOY), wait_ready=False
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60
    )


def test_not_ready_until_warmed(server, client) -> None:
    server.wait_for("/health")
    ready = httpx.get(server.url + "/ready")
    assert (
        ready.status_code == 503 and ready.json()["error"]["code"] == "engine_not_ready"
    )
    with pytest.raises(openai.InternalServerError) as info:
        client.images.generate(
            prompt="too early", size="64x64", extra_body={"num_inference_steps": 2}
        )
    assert (
        info.value.status_code == 503 and info.value.body["code"] == "engine_not_ready"
    )
    assert info.value.response.headers["retry-after"]
    server.wait_for("/ready")
    result = client.images.generate(
        prompt="now", size="64x64", extra_body={"num_inference_steps": 2}
    )
    assert len(result.data) == 1
    # /ready reports the engine loop's heartbeat: an idle loop beats about every 0.5 s.
    loop = httpx.get(server.url + "/ready").json()["loop"]
    assert loop["state"] == "idle" and 0 <= loop["heartbeat_age_s"] < 5, loop


def test_killed_worker_gives_503_engine_dead(server, client) -> None:
    server.wait_for("/ready")
    result = client.images.generate(
        prompt="x", size="64x64", extra_body={"num_inference_steps": 2}
    )
    attestation = result.model_extra["diffserve"]["attestation"]
    worker_pid = attestation["worker_pid"]
    assert attestation["executor"] == "mp" and worker_pid != server.proc.pid
    os.kill(worker_pid, signal.SIGKILL)

    deadline = time.monotonic() + 30
    while True:
        try:
            client.images.generate(
                prompt="x", size="64x64", extra_body={"num_inference_steps": 2}
            )
        except openai.InternalServerError as exc:
            assert exc.status_code == 503 and exc.body["code"] == "engine_dead", (
                exc.body
            )
            break
        assert time.monotonic() < deadline, "the dead worker was never noticed"
        time.sleep(0.1)
    # The server process lives on and keeps answering: probes say why, metrics still
    # scrape.
    assert server.proc.poll() is None
    for path in ("/health", "/ready"):
        resp = httpx.get(server.url + path)
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_dead"
    metrics = httpx.get(server.url + "/metrics")
    assert metrics.status_code == 200 and "diffserve_engine_ready 0.0" in metrics.text
    assert [m.id for m in client.models.list().data] == ["tiny-flux"]
