"""The signals a router or an autoscaler reads from ``/metrics`` (docs/deploy.md#metrics-for-routers-and-
autoscalers): per model and per replica, while real requests run on a two-replica server."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

MODEL = "tiny-flux"
STEPS, SIZE = 100, 128  # long enough (~1-2 s a request on 2 cores) to be seen running
WORK = STEPS * SIZE * SIZE / 1e6  # one request's steps x megapixels


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def documented_router_metrics() -> set[str]:
    """The metric names of docs/deploy.md's router table."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    table = text.split("## Metrics for routers and autoscalers", 1)[1].split("\n\n", 3)[2]
    names = set(re.findall(r"`(diffserve_[a-z_]+)`", table))
    assert len(names) >= 9, table
    return names


def model_value(samples: dict, name: str) -> float:
    return samples[(f"diffserve_model_{name}", (("model", MODEL),))]


def replica_values(samples: dict, name: str) -> dict[str, float]:
    return {dict(labels)["replica"]: v for (metric, labels), v in samples.items()
            if metric == f"diffserve_replica_{name}" and dict(labels).get("model") == MODEL}


def test_queue_in_flight_and_outstanding_work_per_model_and_replica(server_launcher, write_deploy,
                                                                     tiny_flux_dir) -> None:
    deploy = write_deploy("num_replicas: 2\nmax_batch_size: 1\nenforce_eager: true\n"
                          "server:\n  max_steps: 100\n")
    with server_launcher(tiny_flux_dir, "--deploy-config", deploy, "--served-model-name", MODEL) as server:
        idle = scrape(server.url)
        assert documented_router_metrics() <= {name for name, _ in idle}, "a documented router metric is missing"
        assert replica_values(idle, "live") == {"0": 1.0, "1": 1.0}
        for name in ("requests_running", "requests_in_flight", "outstanding_work", "queue_depth"):
            assert model_value(idle, name) == 0.0, name

        statuses: list[int] = []
        body = {"prompt": "a fox", "size": f"{SIZE}x{SIZE}", "num_inference_steps": STEPS, "model": MODEL}

        def post(seed: int) -> None:
            reply = httpx.post(server.url + "/v1/images/generations", json={**body, "seed": seed}, timeout=120)
            statuses.append(reply.status_code)

        threads = [threading.Thread(target=post, args=(seed,)) for seed in range(3)]
        for thread in threads:
            thread.start()
        samples, busiest = [], None
        while any(t.is_alive() for t in threads):
            sample = scrape(server.url)
            samples.append(sample)
            if model_value(sample, "requests_running") == 2 and model_value(sample, "queue_depth") == 1:
                busiest = busiest or sample
            time.sleep(0.02)
        for thread in threads:
            thread.join()
        assert statuses == [200, 200, 200]

        for sample in samples:  # every scrape is consistent with itself
            running, queued = model_value(sample, "requests_running"), model_value(sample, "queue_depth")
            assert model_value(sample, "requests_in_flight") == running + queued
            assert sum(replica_values(sample, "requests_running").values()) == running
            per_replica_work = sum(replica_values(sample, "outstanding_work").values())
            # the waiting requests' work is the model's, not a replica's; no scrape sees more than was asked
            assert model_value(sample, "outstanding_work") == pytest.approx(per_replica_work + queued * WORK, rel=1e-4)
            assert model_value(sample, "outstanding_work") <= 3 * WORK + 1e-6
        # Three requests on two replicas: once two ran and one waited, each replica ran one, the waiting one
        # counted whole and the running ones less than whole (steps done count off).
        assert busiest is not None, f"never saw 2 running + 1 waiting in {len(samples)} scrapes"
        assert replica_values(busiest, "requests_running") == {"0": 1.0, "1": 1.0}
        assert WORK < model_value(busiest, "outstanding_work") <= 3 * WORK
        works = [model_value(s, "outstanding_work") for s in samples if model_value(s, "requests_in_flight") > 0]
        assert min(works) < WORK, "the running requests' finished steps never counted off"

        done = scrape(server.url)
        for name in ("requests_running", "requests_in_flight", "outstanding_work", "queue_depth"):
            assert model_value(done, name) == 0.0, name
        assert replica_values(done, "outstanding_work") == {"0": 0.0, "1": 0.0}
