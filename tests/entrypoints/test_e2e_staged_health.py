"""A staged topology over HTTP: ``/health`` and ``/metrics`` report each stage (live
replicas, queue depth), and a stage whose last worker dies takes the engine down with
503s that name that stage, while the server itself keeps answering."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

STAGED = """
topology: split_text_encoder
dtype: float32
enforce_eager: true
stages:
  - stage_id: 0
    distributed_executor_backend: mp
  - stage_id: 1
    distributed_executor_backend: uni
"""
BODY = {"prompt": "a staged owl", "size": "64x64", "num_inference_steps": 2, "seed": 1}


def stage_gauges(url: str) -> dict[tuple[str, str, str], float]:
    text = httpx.get(url + "/metrics").text
    return {
        (s.name, s.labels["stage"], s.labels["role"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("diffserve_stage_")
    }


def test_a_dead_stage_answers_503_naming_itself(
    server_launcher, write_deploy, tiny_flux_dir
) -> None:
    with server_launcher(
        tiny_flux_dir, "--deploy-config", write_deploy(STAGED)
    ) as server:
        ok = httpx.post(server.url + "/v1/images/generations", json=BODY, timeout=120)
        assert ok.status_code == 200, ok.text
        encode_stage = ok.json()["diffserve"]["attestation"]["stages"][0]
        assert (encode_stage["stage_id"], encode_stage["executor"]) == (0, "mp")
        health = httpx.get(server.url + "/health").json()
        assert health["status"] == "ok"
        assert [
            (s["stage_id"], s["role"], s["replicas_live"], s["queue_depth"])
            for s in health["stages"]
        ] == [(0, "text_encoder", 1, 0), (1, "diffusion", 1, 0)]
        gauges = stage_gauges(server.url)
        for stage, role in (("0", "text_encoder"), ("1", "diffusion")):
            assert gauges[("diffserve_stage_replicas_live", stage, role)] == 1.0
            assert gauges[("diffserve_stage_replicas", stage, role)] == 1.0
            assert gauges[("diffserve_stage_queue_depth", stage, role)] == 0.0

        # The text-encoder stage's only worker.
        os.kill(encode_stage["worker_pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while httpx.get(server.url + "/health").status_code != 503:
            assert time.monotonic() < deadline, (
                "the engine never noticed its stage 0 worker died"
            )
            time.sleep(0.1)
        for response in (
            httpx.get(server.url + "/health"),
            httpx.post(server.url + "/v1/images/generations", json=BODY, timeout=60),
        ):
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert (
                error["code"] == "engine_dead"
                and "stage 0 (text_encoder)" in error["message"]
            ), error
        # The server answers; an orchestrator restarts it.
        assert server.proc.poll() is None
        assert (
            stage_gauges(server.url)[
                ("diffserve_stage_replicas_live", "0", "text_encoder")
            ]
            == 0.0
        )
