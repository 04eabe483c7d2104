"""TeaCache's published polynomials (registry/teacache.py): the digits recomputed by
hand, the model's own fit found from its JSON configs alone (recorded with source
``model``, its threshold with the fit's provenance), and no fit claimed for a shape
nobody fitted."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from diffserve.config.resolve import resolve
from diffserve.config.stage_sections import CacheConfig
from diffserve.errors import ConfigError
from diffserve.models.stepcache.policy import BranchCache, CacheSettings
from diffserve.models.stepcache.teacache import rescale
from diffserve.registry.teacache import TEACACHE_POLYNOMIALS, polynomial_for

WAN_13B = {
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "num_layers": 30,
    "ffn_dim": 8960,
    "in_channels": 16,
}
WAN_14B = {
    "num_attention_heads": 40,
    "attention_head_dim": 128,
    "num_layers": 40,
    "ffn_dim": 13824,
    "in_channels": 16,
}


def test_wan_polynomials_recomputed_by_hand() -> None:
    small, large = (
        TEACACHE_POLYNOMIALS[n].coefficients
        for n in ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b")
    )
    # 2396.76752 x^4 - 1311.10545 x^3 + 201.331979 x^2 - 8.29855975 x + 0.137887774 at x
    # = 0.1, term by term.
    assert rescale(0.1, small) == pytest.approx(
        0.239676752 - 1.31110545 + 2.01331979 - 0.829855975 + 0.137887774, abs=1e-12
    )
    # -303318.725 x^4 + 49053.7029 x^3 - 2655.30556 x^2 + 58.7365115 x - 0.315583525 at
    # x = 0.01.
    assert rescale(0.01, large) == pytest.approx(
        -0.00303318725 + 0.0490537029 - 0.265530556 + 0.587365115 - 0.315583525,
        abs=1e-12,
    )
    for coefficients in (small, large):
        assert rescale(0.037, coefficients) == pytest.approx(
            float(np.polyval(coefficients, 0.037)), rel=1e-12
        )


def test_a_fit_is_claimed_only_for_the_shape_it_was_fitted_on() -> None:
    assert polynomial_for("WanPipeline", WAN_13B)[0] == "wan2.1-t2v-1.3b"  # type: ignore[index]
    assert polynomial_for("WanPipeline", WAN_14B)[0] == "wan2.1-t2v-14b"  # type: ignore[index]
    assert polynomial_for("FluxPipeline", {})[0] == "flux.1-dev"  # type: ignore[index]
    # Wan2.2 A14B: another checkpoint.
    assert polynomial_for("WanPipeline", WAN_14B, experts=2) is None
    assert (
        polynomial_for("WanImageToVideoPipeline", {**WAN_14B, "in_channels": 36})
        is None
    )
    assert polynomial_for("WanPipeline", {**WAN_13B, "num_layers": 2}) is None


def _wan_configs_shaped_like(source: Path, target: Path, shape: dict[str, int]) -> Path:
    """The model directory's JSON files (the resolver reads nothing else), its
    transformer config reshaped."""
    (target / "transformer").mkdir(parents=True)
    shutil.copy(source / "model_index.json", target / "model_index.json")
    config = json.loads((source / "transformer" / "config.json").read_text())
    (target / "transformer" / "config.json").write_text(json.dumps({**config, **shape}))
    return target


def test_resolve_takes_the_models_fit_and_its_threshold(
    tiny_wan_dir: Path, tmp_path: Path
) -> None:
    model = _wan_configs_shaped_like(tiny_wan_dir, tmp_path / "wan13b", WAN_13B)
    config = resolve(model=model, overrides={"cache": {"backend": "teacache"}}, env={})
    stage = config.stage_for_role("diffusion")
    assert stage.cache.teacache_coefficients == "wan2.1-t2v-1.3b"
    assert config.provenance["stages.0.cache.teacache_coefficients"].layer == "model"
    assert stage.cache.threshold == 0.08
    threshold = config.provenance["stages.0.cache.threshold"]
    assert threshold.layer == "default" and "TeaCache4Wan2.1" in threshold.describe()
    # A deploy's explicit choice beats the model's fit; the tiny model has none, so auto
    # stays auto.
    named = resolve(
        model=model,
        overrides={
            "cache": {"backend": "teacache", "teacache_coefficients": "wan2.1-t2v-14b"}
        },
        env={},
    )
    assert named.stage_for_role("diffusion").cache.threshold == 0.2
    tiny = resolve(
        model=tiny_wan_dir, overrides={"cache": {"backend": "teacache"}}, env={}
    )
    assert tiny.stage_for_role("diffusion").cache.teacache_coefficients == "auto"
    with pytest.raises(ConfigError, match="not a valid TeaCache polynomial") as error:
        resolve(
            model=tiny_wan_dir,
            overrides={"cache": {"teacache_coefficients": "wan2.1-t2v-13b"}},
            env={},
        )
    assert "wan2.1-t2v-1.3b" in str(error.value)


def test_the_14b_fit_retains_five_steps_and_computes_outside_its_range() -> None:
    """A probe growing 5% a step (inside the fit: 0.219 each), then 15% (past 0.082 the
    polynomial is negative, so TeaCache4Wan2.1 would skip every step from there):
    retention, accumulation, the out-of-fit guard, last step."""
    polynomial = TEACACHE_POLYNOMIALS["wan2.1-t2v-14b"]
    settings = CacheSettings.for_batch(CacheConfig(backend="teacache"), 0.5, polynomial)
    assert (settings.warmup_steps, settings.polynomial) == (5, "wan2.1-t2v-14b")
    assert rescale(0.05, polynomial.coefficients) == pytest.approx(0.218949, abs=1e-6)
    assert rescale(0.15, polynomial.coefficients) < 0
    cache = BranchCache(settings, total_steps=12)
    cache.add_rows(1)
    probe, computed = torch.ones(1, 6, 8, dtype=torch.float64), []
    for step in range(12):
        probe = probe * (1.05 if step < 9 else 1.15)
        compute = cache.decide([step], probe)
        cache.apply(compute, torch.zeros(1, 4), lambda rows: torch.ones(1, 4))
        computed.append(compute[0])
    # 0.219, 0.438 skip; 0.657 computes; 0.219 skips; out of the fit twice; the last
    # step.
    assert computed == [True] * 5 + [False, False, True, False, True, True, True]
    # The rescaled value is attested as it was.
    assert cache.report(0)["trace"][9][1] < 0
