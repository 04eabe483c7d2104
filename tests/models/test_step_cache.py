"""Step caching on the native FLUX pipeline (tiny-flux, 20 steps): off is bit-identical
to no cache, a larger threshold never skips fewer steps, skipped steps really skip the
blocks' kernels, the warmup, last-step and consecutive-skip rules hold, and every image
of a batch equals the same request alone.

On these random-weight models block 0's residual changes by ~0.4-0.5 per step and
TeaCache's rescaled signal is ~0.18, so the published defaults (0.08, 0.6) skip little
or nothing: the tests use thresholds that do skip.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from diffserve.layers.linear.module import Linear
from diffserve.models.base import library_admit
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.models.stepcache.teacache import FLUX_COEFFICIENTS, rescale
from diffserve.types.batching import batch_key
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult

STEPS = 20
BACKENDS = ("fbcache", "teacache")


def _req(**kw: Any) -> GenerationRequest:
    base = dict(
        prompt="a red fox in the snow",
        height=64,
        width=64,
        num_inference_steps=STEPS,
        seed=11,
        max_sequence_length=32,
    )
    return GenerationRequest(**{**base, **kw})


def _pipe(model: Any, **cache: Any) -> FluxPipeline:
    return FluxPipeline.from_pretrained(
        model, linear_backend="torch", attention_backend="sdpa", cache=cache
    )


@pytest.fixture(scope="module")
def plain(tiny_flux_dir) -> FluxPipeline:
    return FluxPipeline.from_pretrained(
        tiny_flux_dir, linear_backend="torch", attention_backend="sdpa"
    )


@pytest.fixture(scope="module", params=BACKENDS)
def cached(request, tiny_flux_dir) -> FluxPipeline:
    return _pipe(tiny_flux_dir, backend=request.param)


def _run(pipe: FluxPipeline, request: GenerationRequest) -> tuple[Any, dict[str, Any]]:
    """One request; its result and the kernel counters of exactly that run."""
    pipe.kernel_counters.reset()
    result = pipe(request)
    return result, pipe.kernel_counters.snapshot()


def test_teacache_polynomial_recomputed_by_hand() -> None:
    # 498.651651e-4 - 283.781631e-3 + 55.8554382e-2 - 3.82021401e-1 + 0.264230861,
    # written out term by term.
    assert rescale(0.1) == pytest.approx(
        0.0498651651 - 0.283781631 + 0.558554382 - 0.382021401 + 0.264230861, abs=1e-12
    )
    assert rescale(0.1) == pytest.approx(0.2068473761, abs=1e-10)
    assert rescale(0.0) == 0.264230861
    assert rescale(0.37) == pytest.approx(
        float(np.polyval(FLUX_COEFFICIENTS, 0.37)), rel=1e-12
    )


@pytest.mark.parametrize("threshold", [0.0, 1e-9])
def test_threshold_zero_and_all_computed_steps_equal_no_cache_bit_for_bit(
    plain, cached, threshold
) -> None:
    # 0 turns the cache off; 1e-9 runs the cached path with every step computed: both
    # are the plain images.
    reference, counts = _run(plain, _req(n=2))
    out, cached_counts = _run(cached, _req(n=2, cache_threshold=threshold))
    assert torch.equal(out.images, reference.images)
    entries = out.attestation["cache"]
    assert len(entries) == 2 and all(
        e["skipped_steps"] == 0 and e["computed_steps"] == STEPS for e in entries
    )
    assert (
        cached_counts["transformer_forwards"] == counts["transformer_forwards"] == STEPS
    )
    if threshold == 0.0:
        assert cached_counts == counts and entries[0]["threshold"] == 0.0


def test_larger_threshold_never_skips_fewer_steps(cached) -> None:
    skipped = []
    for threshold in (0.05, 0.2, 0.35, 0.45, 0.5, 0.6, 0.8, 1.0):
        entry = cached(_req(cache_threshold=threshold)).attestation["cache"][0]
        assert entry["computed_steps"] + entry["skipped_steps"] == STEPS
        assert (
            entry["threshold"] == threshold and entry["backend"] == cached.cache.backend
        )
        skipped.append(entry["skipped_steps"])
    assert skipped == sorted(skipped), skipped
    assert skipped[-1] > 0, "the sweep must reach thresholds that skip on this model"


def _linears(module: torch.nn.Module) -> int:
    return sum(isinstance(m, Linear) for m in module.modules())


def test_skipped_steps_skip_the_blocks_kernels(cached) -> None:
    _, full = _run(cached, _req(cache_threshold=0.0))
    out, counts = _run(cached, _req(cache_threshold=0.7))
    entry = out.attestation["cache"][0]
    skipped = entry["skipped_steps"]
    assert skipped > 0
    transformer = cached.transformer
    if cached.cache.backend == "fbcache":
        # Block 0 is the probe and runs every step; the other blocks run only on
        # computed steps.
        per_skip = (
            _linears(transformer)
            - _linears(transformer.double_blocks[0])
            - _linears(transformer.img_in)
            - _linears(transformer.txt_in)
            - _linears(transformer.time_in)
            - _linears(transformer.vector_in)
            - _linears(transformer.final_layer)
        )
        probe_extra = 0
    else:
        # Every block is skipped; the probe is block 0's image modulation, one more
        # linear per step.
        per_skip = sum(
            _linears(b)
            for b in (*transformer.double_blocks, *transformer.single_blocks)
        )
        probe_extra = STEPS
    assert (
        counts["linear"]["torch"]
        == full["linear"]["torch"] - skipped * per_skip + probe_extra
    )
    attention_per_step = full["attention"]["sdpa"] // STEPS
    blocks_skipped = attention_per_step - (
        1 if cached.cache.backend == "fbcache" else 0
    )
    assert (
        counts["attention"]["sdpa"]
        == full["attention"]["sdpa"] - skipped * blocks_skipped
    )
    assert counts["transformer_forwards"] == entry["computed_steps"] == STEPS - skipped


@pytest.mark.parametrize("backend", BACKENDS)
def test_warmup_last_step_and_consecutive_skip_rules(tiny_flux_dir, backend) -> None:
    pipe = _pipe(
        tiny_flux_dir,
        backend=backend,
        threshold=0.9,
        warmup_steps=4,
        max_consecutive_skips=2,
    )
    trace = pipe(_req()).attestation["cache"][0]["trace"]
    decisions = [d for _, _, d in trace]
    assert [s for s, _, _ in trace] == list(range(1, STEPS + 1))
    assert decisions[:4] == ["compute"] * 4 and decisions[-1] == "compute"
    assert "skip" in decisions
    assert "skip,skip,skip" not in ",".join(decisions)
    assert trace[0][1] is None  # nothing to compare step 1 with
    # A skipped step's signal is below the threshold; teacache's is the accumulated
    # rescaled value.
    assert all(signal < 0.9 for _, signal, d in trace if d == "skip")


@pytest.mark.parametrize(
    "cfg",
    [{}, dict(negative_prompt="dark", true_cfg_scale=3.0)],
    ids=["plain", "true-cfg"],
)
def test_each_image_of_a_batch_equals_the_request_alone(cached, cfg) -> None:
    # Per-row decisions: the rows of one batch skip different steps, yet each image is
    # its solo run.
    threshold = 0.45 if cached.cache.backend == "fbcache" else 0.5
    batch = [
        _req(seed=1, cache_threshold=threshold, **cfg),
        _req(
            prompt="a blue house at night",
            seed=2,
            n=2,
            cache_threshold=threshold,
            **cfg,
        ),
    ]
    result = [
        e
        for e in cached.run([library_admit(cached, r) for r in batch])
        if isinstance(e, BatchResult)
    ][0]
    traces = []
    for request, output in zip(batch, result.outputs, strict=True):
        alone = cached(request)
        assert torch.equal(output.images, alone.images)
        assert output.attestation["cache"] == alone.attestation["cache"]
        assert len(output.attestation["cache"]) == request.n
        traces += [e["trace"] for e in output.attestation["cache"]]
        if cfg:
            negative = output.attestation["cache"][0]["negative"]
            assert negative["computed_steps"] + negative["skipped_steps"] == STEPS
    assert sum(t[2] == "skip" for trace in traces for t in trace) > 0
    if cached.cache.backend == "fbcache":
        # TeaCache's signal is nearly constant on random weights (every row decides
        # alike); block 0's residual is not, so here the rows of one batch really take
        # different decisions.
        assert len({str([t[2] for t in trace]) for trace in traces}) > 1, (
            "rows should decide differently here"
        )


def test_thresholds_are_part_of_the_batch_key() -> None:
    assert batch_key(_req(cache_threshold=0.3)) != batch_key(_req(cache_threshold=0.4))
    assert batch_key(_req(cache_threshold=0.3)) == batch_key(
        _req(cache_threshold=0.3, seed=5)
    )


def test_a_stage_without_cache_reports_every_step_computed(plain) -> None:
    entry = plain(_req(num_inference_steps=3)).attestation["cache"][0]
    assert entry == {
        "backend": "none",
        "threshold": 0.0,
        "computed_steps": 3,
        "skipped_steps": 0,
        "trace": [[1, None, "compute"], [2, None, "compute"], [3, None, "compute"]],
    }
