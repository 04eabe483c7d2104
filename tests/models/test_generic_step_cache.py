"""First-Block Cache on the generic path (models/generic/step_cache.py), on Qwen-Image
(CFG as two forwards a step) and SD3 (CFG batched, negative rows first): threshold 0 is
the uncached image bit for bit, a skipping run says per image which steps it skipped
(both CFG branches), skipped forwards run no block but the first and are not counted,
and what the path cannot do is refused when the config is resolved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_generic_pipeline import build, make_request

from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError

FBCACHE = {"cache": {"backend": "fbcache"}}
FIXTURES = {"qwen": "tiny_qwen_image_dir", "sd3": "tiny_sd3_dir"}


def _run(pipe: Any, **fields: Any) -> tuple[np.ndarray, dict[str, Any], int]:
    """One 5-step request: its image, attestation and the transformer forwards it
    counted."""
    pipe.kernel_counters.reset()
    out = pipe(make_request(num_inference_steps=5, **fields))
    return (
        out.images[0].numpy(),
        out.attestation,
        pipe.kernel_counters.snapshot()["transformer_forwards"],
    )


def _linear_calls(pipe: Any) -> int:
    return int(pipe.kernel_counters.snapshot()["linear"]["torch"])


@pytest.mark.parametrize("family", list(FIXTURES))
def test_threshold_zero_is_the_uncached_image_bit_for_bit(
    family: str, request: pytest.FixtureRequest
) -> None:
    model = request.getfixturevalue(FIXTURES[family])
    plain, plain_attestation, plain_forwards = _run(build(model))
    cached, attestation, forwards = _run(build(model, **FBCACHE), cache_threshold=0.0)
    # 5 steps: Qwen-Image's two CFG forwards each, SD3's one batched forward each.
    assert np.array_equal(plain, cached) and forwards == plain_forwards == (
        10 if family == "qwen" else 5
    )
    assert "cache" not in plain_attestation
    (entry,) = attestation["cache"]
    assert (
        entry["backend"],
        entry["threshold"],
        entry["computed_steps"],
        entry["skipped_steps"],
    ) == ("fbcache", 0.0, 5, 0)
    # CFG ran: the negative branch is reported too.
    assert entry["negative"]["skipped_steps"] == 0


@pytest.mark.parametrize("family", list(FIXTURES))
def test_a_high_threshold_skips_with_a_per_image_entry(
    family: str, request: pytest.FixtureRequest
) -> None:
    model = request.getfixturevalue(FIXTURES[family])
    pipe = build(model, **FBCACHE)
    plain, _, _ = _run(pipe, cache_threshold=0.0)
    linear_full = _linear_calls(pipe)
    skipped, attestation, forwards = _run(pipe, cache_threshold=1.0)
    linear_cached = _linear_calls(pipe)
    (entry,) = attestation["cache"]
    # Step 1 (warm-up) and step 5 (the last) always compute; each branch decides alone,
    # both skip here.
    for branch in (entry, entry["negative"]):
        assert (
            branch["skipped_steps"] >= 1
            and branch["computed_steps"] + branch["skipped_steps"] == 5
        )
        assert [t[2] for t in branch["trace"]][0] == "compute" and branch["trace"][-1][
            2
        ] == "compute"
        # The signal compared with the threshold.
        assert all(t[1] is not None for t in branch["trace"][1:])
    # A skipped forward runs the embeddings, block 0 and the head only: fewer Linear
    # calls, and it does not count as a transformer forward (as on the native path).
    computed = entry["computed_steps"] + entry["negative"]["computed_steps"]
    assert forwards == (computed if family == "qwen" else entry["computed_steps"])
    assert linear_cached < linear_full
    assert (
        skipped.shape == plain.shape
        and np.isfinite(skipped).all()
        and not np.array_equal(skipped, plain)
    )


def test_two_images_of_a_request_each_get_an_entry(tiny_qwen_image_dir: Path) -> None:
    pipe = build(tiny_qwen_image_dir, **FBCACHE)
    out = pipe(make_request(num_inference_steps=4, n=2, cache_threshold=1.0))
    assert len(out.attestation["cache"]) == 2
    assert all(e["skipped_steps"] >= 1 for e in out.attestation["cache"])


def test_what_the_generic_path_cannot_cache_is_refused_at_resolve(
    tiny_qwen_image_dir: Path, tiny_z_image_dir: Path
) -> None:
    with pytest.raises(
        ConfigError, match="TeaCache .* none is published for QwenImagePipeline"
    ) as info:
        resolve(
            model=tiny_qwen_image_dir,
            overrides={"cache": {"backend": "teacache"}},
            env={},
        )
    assert "stages.0.cache.backend" in str(info.value) and "fbcache" in str(info.value)
    with pytest.raises(
        ConfigError, match="ZImagePipeline on the generic path has no step cache"
    ):
        resolve(model=tiny_z_image_dir, overrides=FBCACHE, env={})
    with pytest.raises(ConfigError, match="runs eager") as info:
        resolve(
            model=tiny_qwen_image_dir,
            overrides={**FBCACHE, "enforce_eager": False},
            env={},
        )
    assert "stages.0.enforce_eager" in str(info.value)
