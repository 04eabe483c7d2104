"""Step caching through the engine: the issue's acceptance (``Engine(model,
cache={...})``), per-request thresholds and their admission errors, uni vs mp, and the
cache under CFG-parallel and Ulysses (each branch decides alone; the ranks of a Ulysses
group agree through one all_reduce of the signal)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from diffserve import Engine, GenerationRequest
from diffserve.errors import RequestError

pytestmark = pytest.mark.e2e

STEPS = 20
# skips on the random-weight tiny model (block 0's residual changes ~0.4-0.5 per step)
SKIPPING = 0.5


def request(
    steps: int = STEPS, n: int = 2, cfg: bool = False, **kw: Any
) -> GenerationRequest:
    extra: dict[str, Any] = (
        {"negative_prompt": "blurry, dark", "true_cfg_scale": 3.0} if cfg else {}
    )
    return GenerationRequest(
        prompt="a red fox in snow",
        height=64,
        width=64,
        num_inference_steps=steps,
        guidance_scale=0.0,
        max_sequence_length=32,
        seed=5,
        n=n,
        **extra,
        **kw,
    )


def pixels(out: Any) -> np.ndarray:
    return np.stack([np.asarray(image) for image in out.images])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def engine(tiny_flux_dir):
    with Engine(
        str(tiny_flux_dir),
        env={},
        enforce_eager=True,
        max_batch_size=4,
        cache={"backend": "fbcache", "threshold": 0.2},
    ) as e:
        yield e


def test_acceptance_one_entry_per_image_and_fewer_linear_calls(engine) -> None:
    out = engine.generate(request())
    entries = out.attestation["cache"]
    assert len(entries) == 2
    for entry in entries:
        assert entry["backend"] == "fbcache" and entry["threshold"] == 0.2
        assert entry["computed_steps"] + entry["skipped_steps"] == STEPS
        assert len(entry["trace"]) == STEPS
    uncached = engine.generate(request(cache_threshold=0.0))
    skipping = engine.generate(request(cache_threshold=SKIPPING))
    skipped = [e["skipped_steps"] for e in skipping.attestation["cache"]]
    assert min(skipped) > 0
    assert sum(skipping.attestation["linear"].values()) < sum(
        uncached.attestation["linear"].values()
    )
    assert (
        skipping.attestation["transformer_forwards"]
        < uncached.attestation["transformer_forwards"]
        == STEPS
    )
    assert all(e["skipped_steps"] == 0 for e in uncached.attestation["cache"])
    assert not np.array_equal(pixels(skipping), pixels(uncached))


def test_request_threshold_is_bounded_by_the_stage(engine, tiny_flux_dir) -> None:
    with pytest.raises(RequestError) as info:
        engine.generate(request(cache_threshold=1.5))
    assert info.value.param == "cache_threshold" and "max_threshold" in str(info.value)
    with pytest.raises(RequestError) as info:
        request(cache_threshold=-0.1)
    assert info.value.param == "cache_threshold"
    # The engine keeps serving after refusing.
    assert (
        engine.generate(request(steps=2, n=1)).attestation["cache"][0]["threshold"]
        == 0.2
    )


def test_a_threshold_on_a_stage_without_cache_is_refused(tiny_flux_dir) -> None:
    with Engine(str(tiny_flux_dir), env={}, enforce_eager=True) as plain:
        with pytest.raises(RequestError) as info:
            plain.generate(request(cache_threshold=0.3))
        assert info.value.param == "cache_threshold" and "cache.backend: none" in str(
            info.value
        )
        assert (
            plain.generate(request(steps=2, n=1, cache_threshold=0.0)).attestation[
                "cache"
            ][0]["backend"]
            == "none"
        )


def test_uni_and_mp_give_identical_cached_images(engine, tiny_flux_dir) -> None:
    reference = engine.generate(request(cache_threshold=SKIPPING))
    with Engine(
        str(tiny_flux_dir),
        env={},
        enforce_eager=True,
        distributed_executor_backend="mp",
        cache={"backend": "fbcache"},
    ) as mp:
        out = mp.generate(request(cache_threshold=SKIPPING))
    assert out.attestation["executor"] == "mp"
    assert np.array_equal(pixels(out), pixels(reference))
    assert out.attestation["cache"] == reference.attestation["cache"]


# The signal agreement is backend-independent: one backend per layout keeps the suite
# short.
@pytest.mark.parametrize(
    ("backend", "parallel"),
    [("teacache", {"cfg_parallel_size": 2}), ("fbcache", {"ulysses_degree": 2})],
    ids=["cfg2", "ulysses2"],
)
def test_parallel_ranks_cache_like_one_rank(
    tiny_flux_dir, backend: str, parallel: dict[str, int]
) -> None:
    steps, threshold = 8, SKIPPING
    cfg_request = request(steps=steps, n=1, cfg=True, cache_threshold=threshold)
    with Engine(
        str(tiny_flux_dir), env={}, enforce_eager=True, cache={"backend": backend}
    ) as single:
        reference = single.generate(cfg_request)
    with Engine(
        str(tiny_flux_dir),
        env={},
        enforce_eager=True,
        distributed_executor_backend="mp",
        cache={"backend": backend},
        **parallel,
    ) as e:
        out = e.generate(cfg_request)
        uncached = e.generate(request(steps=steps, n=1, cfg=True, cache_threshold=0.0))
    if "ulysses_degree" in parallel:
        # A Ulysses rank's GEMMs run on its image-token shard, another shape than the
        # single rank's: to a PSNR (float32 60 dB, bfloat16 40 dB: the dtype is the
        # platform's; AVX2, float32: equal). CFG ranks run each branch's own kernels on
        # its own shapes: bit for bit.
        floor = 60.0 if reference.attestation["dtype"] == "float32" else 40.0
        assert psnr(pixels(out), pixels(reference)) >= floor, psnr(
            pixels(out), pixels(reference)
        )
    else:
        assert np.array_equal(pixels(out), pixels(reference))
    entry, expected = out.attestation["cache"][0], reference.attestation["cache"][0]
    assert (
        entry["skipped_steps"] > 0
        and entry["negative"]["computed_steps"] + entry["negative"]["skipped_steps"]
        == steps
    )
    # Decisions agree with the single rank (signals are float64 sums; a Ulysses group
    # adds its shards' partial sums, so the last digits of a signal may differ, never a
    # decision).
    assert [t[2] for t in entry["trace"]] == [t[2] for t in expected["trace"]]
    assert [t[2] for t in entry["negative"]["trace"]] == [
        t[2] for t in expected["negative"]["trace"]
    ]
    signals = [
        (t[1], u[1])
        for t, u in zip(entry["trace"], expected["trace"], strict=True)
        if t[1] is not None
    ]
    assert all(a == pytest.approx(b, rel=1e-5) for a, b in signals)
    reduces = out.attestation["collectives"].get("all_reduce", {}).get("calls", 0)
    plain_reduces = (
        uncached.attestation["collectives"].get("all_reduce", {}).get("calls", 0)
    )
    if "ulysses_degree" in parallel:
        # One all_reduce of the signal per step, per branch, per rank (step 1 has
        # nothing to compare).
        assert reduces - plain_reduces == 2 * 2 * (steps - 1)
    else:
        # CFG ranks decide per branch: nothing to agree on.
        assert reduces == plain_reduces
