"""Section s's pieces that need no model (the run itself is in the benchmark smoke run,
test_bench_smoke.py): the seeded mix, the closed-loop FIFO worker's submission times,
the step cache's skipped steps read off an output, and the targets' verdicts."""

from __future__ import annotations

import time
from types import SimpleNamespace

from benchmarks import mixed_load as L
from benchmarks.mixed_targets import mixed_targets
from benchmarks.settings import FULL, SMOKE


def test_the_mix_is_seeded_and_draws_every_value() -> None:
    mix = L.draw_mix(400, (64, 128, 192, 256), (4, 8), (0.0, 0.6))
    assert mix == L.draw_mix(400, (64, 128, 192, 256), (4, 8), (0.0, 0.6))
    assert mix != L.draw_mix(400, (64, 128, 192, 256), (4, 8), (0.0, 0.6), seed=1)
    assert {m.size for m in mix} == {64, 128, 192, 256}
    assert {m.steps for m in mix} == {4, 8}
    assert {m.threshold for m in mix} == {0.0, 0.6}
    assert {m.adapter for m in mix} == {None, "A", "B"}
    summary = L.mix_summary(mix)
    assert "sizes 128:" in summary and "adapters A:" in summary and "none:" in summary
    warm = L.warmup_mix((64, 128), (2, 3), 0.6)
    assert {m.size for m in warm} == {64, 128} and {m.adapter for m in warm} == {
        None,
        "A",
        "B",
    }


def test_engine_request_carries_threshold_and_adapter() -> None:
    request = L.engine_request("tiny-flux", L.Mixed(192, 8, 0.6, "A"), seed=7)
    assert (request.height, request.width, request.num_inference_steps) == (192, 192, 8)
    assert request.cache_threshold == 0.6 and request.loras == (("A", 1.0),)
    assert L.engine_request("tiny-flux", L.Mixed(64, 4, 0.0, None), seed=7).loras == ()


def test_closed_loop_fifo_submits_each_request_when_its_client_is_free() -> None:
    """8 clients, one worker: requests are served in index order, request i is
    submitted when request i - clients completed."""
    mix = [L.Mixed(64, 2, 0.0, None)] * 5

    def call(item: L.Mixed, seed: int) -> None:
        time.sleep(0.01)

    run = L.closed_sequential(call, mix, clients=2)
    assert run.arrivals[:2] == [0.0, 0.0]
    assert run.arrivals[2:] == run.completions[:3]
    assert all(lat >= 0.01 - 1e-3 for lat in run.latencies)
    assert run.completions == sorted(run.completions)
    pooled = L.pool([run, L.MixedRun([0.0], [1.0], skipped=[3])])
    assert pooled.skipped == [3] and len(pooled.latencies) == 6


def test_skipped_steps_from_the_cache_attestation() -> None:
    trace = [[1, None, "compute"], [2, 0.3, "skip"], [3, 0.4, "skip"], [4, 0.9, "x"]]
    out = SimpleNamespace(attestation={"cache": [{"trace": trace}]})
    assert L.skipped_steps(out) == 2
    assert L.skipped_steps(SimpleNamespace(attestation={})) == 0
    assert L.skipped_steps(SimpleNamespace(attestation={"cache": {"trace": []}})) == 0


def test_targets_verdicts() -> None:
    m = {
        "mixed.open.step.p95_s": 1.0,
        "mixed.open.request.p95_s": 2.0,
        "mixed.open.step.p50_s": 0.5,
        "mixed.open.request.p50_s": 0.6,
        "mixed.open.step.images_per_s": 5.0,
        "mixed.open.request.images_per_s": 5.0,
        "mixed.closed.vs_diffusers": 1.2,
    }
    latency, throughput = mixed_targets(m, FULL)
    assert (latency.status, latency.measured) == ("met", "0.50")
    assert (throughput.status, throughput.measured) == ("missed", "1.20x")
    # Faster tail bought with fewer images/s does not count.
    slower = {**m, "mixed.open.step.images_per_s": 4.0}
    assert mixed_targets(slower, FULL)[0].status == "missed"
    assert {t.status for t in mixed_targets(m, SMOKE)} == {"not measured"}
    assert {t.status for t in mixed_targets({}, FULL)} == {"not measured"}


def test_failed_batches_counts_the_engines_fallback_warning() -> None:
    import logging

    log = logging.getLogger("diffserve.engine.batch_run")
    with L.FailedBatches() as failed:
        log.warning("batch of %d failed (%s); retrying its requests one by one", 2, "x")
        log.warning("something else")
    log.warning("batch of %d failed (%s); retrying its requests one by one", 3, "y")
    assert failed.count == 1 and failed.first.startswith("batch of 2 failed (x)")
    m = {"mixed.closed.vs_diffusers": 2.0, "mixed.failed_batches.closed": 4}
    assert "4 step-level batches failed" in mixed_targets(m, FULL)[1].note
