"""The native models' hidden widths keep batch invariance on every CPU kind.

ATen's elementwise loops run two vector widths at a time and the tail of a tensor with
scalar code, which rounds ``exp`` differently. A row of a batch is computed as it is
alone only when its element count is a multiple of two vector widths: 64 bfloat16 values
on AVX-512 (32 float32; 16 on AVX2). A 48-wide tiny Wan broke this on Intel AMX only
(docs/engine.md, "Batch invariance"): every model the tests and the demo serve on the
native path keeps its widths multiples of 64."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from diffserve.zoo.flux_specs import SPECS as FLUX_SPECS
from diffserve.zoo.toy_motion.train import TRANSFORMER_CONFIG as TOY_MOTION
from diffserve.zoo.toy_shapes.train import TRANSFORMER_CONFIG as TOY_SHAPES
from diffserve.zoo.wan_specs import WAN_SPECS

CONFIGS: dict[str, dict[str, Any]] = {
    **{name: spec.transformer for name, spec in FLUX_SPECS.items()},
    **{name: spec.transformer for name, spec in WAN_SPECS.items()},
    "toy-shapes": TOY_SHAPES,
    "toy-motion": TOY_MOTION,
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hidden_width_is_a_multiple_of_64(name: str) -> None:
    config = CONFIGS[name]
    width = config["num_attention_heads"] * config["attention_head_dim"]
    assert width % 64 == 0, f"{name}: hidden width {width}"


@pytest.mark.numerics
def test_a_row_of_a_batch_is_computed_as_alone_at_that_width() -> None:
    # The rule at work: a SiLU over three 64-wide rows gives each row exactly what the
    # row gives alone, in both dtypes, on whatever CPU kind runs this.
    for dtype in (torch.float32, torch.bfloat16):
        rows = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
        together = torch.nn.functional.silu(rows)
        for i in range(3):
            alone = torch.nn.functional.silu(rows[i : i + 1].clone())
            assert torch.equal(together[i : i + 1], alone), (dtype, i)
