"""compile=True: blocks go through torch.compile (inductor, dynamic shapes as on a CPU)
as one graph each (a graph break fails), results unchanged, and the counts read from
the traced graphs (``layers/traced_tally.py``) equal to the eager ones. The single
blocks are the fused ones a GPU runs (merged GEMM with a GELU tail, no
concatenation)."""

from __future__ import annotations

import shutil

import pytest
import torch
from flux_helpers import flux_transformer
from torch._dynamo.utils import counters

from diffserve.layers.linear.module import Linear

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("cc") is None and shutil.which("gcc") is None,
        reason="torch.compile (inductor) on CPU needs a C compiler",
    ),
]


def test_compiled_blocks_match_eager_and_still_count(tiny_flux_dir) -> None:
    eager = flux_transformer(tiny_flux_dir / "transformer", attention="sdpa")
    compiled = flux_transformer(tiny_flux_dir / "transformer", attention="sdpa")
    compiled.fuse_single_blocks()
    compiled.compile_blocks()
    n_linear = sum(isinstance(m, Linear) for m in compiled.modules())
    n_blocks = len(compiled.double_blocks) + len(compiled.single_blocks)
    g = torch.Generator().manual_seed(0)
    graphs_before = counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        # A second image size runs on the graphs the first one compiled.
        for tokens in (16, 24):
            img = torch.randn(1, tokens, 64, generator=g)
            txt = torch.randn(1, 8, 64, generator=g)
            img_ids = torch.stack(
                [
                    torch.zeros(tokens),
                    torch.arange(tokens) // 4,
                    torch.arange(tokens) % 4,
                ],
                -1,
            )
            args = (
                img,
                img_ids.float(),
                txt,
                torch.zeros(8, 3),
                torch.tensor([0.5]),
                torch.randn(1, 32, generator=g),
            )
            torch.testing.assert_close(
                compiled(*args), eager(*args), rtol=1e-4, atol=1e-5
            )
    # One dynamic-shape graph per block class: no recompile for the second size (a
    # slice's bounds once pinned the sequence length, so every new image size recompiled
    # both block classes).
    assert counters["stats"]["unique_graphs"] - graphs_before == len(
        {type(b) for b in compiled.double_blocks}
        | {type(b) for b in compiled.single_blocks}
    )
    expected = {
        "linear": {"torch": 2 * n_linear},
        "attention": {"sdpa": 2 * n_blocks},
        "transformer_forwards": 2,
    }
    assert compiled.counters.snapshot() == eager.counters.snapshot() == expected
    # What the two graphs captured: a double block's 10 projections and a single
    # block's 4 (linear1 as diffserve's GEMM-with-GELU-tail op), one attention each
    assert compiled.traced_ops() == {
        "linear": 10 + 3,
        "diffserve.gemm_gelu_tail": 1,
        "scaled_dot_product_attention": 2,
    }
