"""Kernel counts of compiled modules read from the traced graph
(``layers/traced_tally.py``): equal to the eager counts, one graph per shape when
static, shared by modules of one kind, and a compilation that fails when the graph
would run a kernel the attestation cannot see or skip one it claims. (The graphs are run
by the ``eager`` inner backend here; ``tests/models/test_flux_compile.py`` runs
inductor.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffserve.config.stage_sections import AttentionBackendConfig
from diffserve.layers.kernels import build_kernel_set
from diffserve.layers.traced_tally import (
    TracedTallyError,
    compile_counted,
    module_path,
    op_name,
)


def kernels(batch_invariant: bool = True):
    return build_kernel_set(
        "torch",
        AttentionBackendConfig("sdpa"),
        roles=("block",),
        device="cpu",
        dtype=torch.float32,
        batch_invariant=batch_invariant,
    )


class Block(nn.Module):
    """Two Linears and one attention call, plus (optionally) a stray matmul or a Linear
    it never calls."""

    def __init__(self, ks, stray: bool = False, idle: bool = False) -> None:
        super().__init__()
        self.qkv = ks.make_linear(32, 96)
        self.out = nn.Sequential(ks.make_linear(32, 32))
        self.attn = ks.make_attention("block")
        self.stray = stray
        self.idle = ks.make_linear(32, 32) if idle else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x).unflatten(-1, (3, 2, 16))  # [B, L, 3, H, D]
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = self.out(self.attn(q, k, v))
        if self.stray:
            y = y @ torch.eye(32)  # a GEMM no Linear owns
        return y + x


def test_traced_counts_equal_eager_counts_and_graphs_are_shared() -> None:
    ks_eager, ks_compiled = kernels(), kernels()
    eager = [Block(ks_eager) for _ in range(3)]
    compiled = [Block(ks_compiled) for _ in range(3)]
    for e, c in zip(eager, compiled, strict=True):
        c.load_state_dict(e.state_dict())
    compilers = compile_counted(compiled, ks_compiled.counters, inner="eager")
    assert len(compilers) == 1  # one kind of block: one compiler, shared graphs
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for tokens in (8, 12, 8):  # static shapes: a graph per sequence length
            x = torch.randn(2, tokens, 32, generator=g)  # two samples: per-sample calls
            ye, yc = x, x
            for e, c in zip(eager, compiled, strict=True):
                ye, yc = e(ye), c(yc)
            # the graph runs the same ops; a tolerance all the same (another kind may
            # pick other kernels for a traced call)
            torch.testing.assert_close(yc, ye, rtol=1e-6, atol=1e-6)
    assert (
        ks_compiled.counters.snapshot()
        == ks_eager.counters.snapshot()
        == {
            "linear": {"torch": 18},
            "attention": {"sdpa": 9},
            "transformer_forwards": 0,
        }
    )
    tallies = compilers[0].tallies
    assert len(tallies) == 2  # lengths 8 and 12; the third pass reused the first
    # Per-sample calls: each module's op traced once per sample, counted once
    assert tallies[0].ops == {"linear": 4, "scaled_dot_product_attention": 2}
    assert tallies[0].linear == {"torch": 2} and tallies[0].attention == {"sdpa": 1}


def test_a_stray_gemm_fails_compilation() -> None:
    ks = kernels(batch_invariant=False)
    block = Block(ks, stray=True)
    compile_counted([block], ks.counters, inner="eager")
    with pytest.raises(Exception, match="outside any counted Linear") as caught:
        block(torch.randn(1, 8, 32))
    # torch wraps a backend's exception (BackendCompilerFailed) and keeps it
    assert isinstance(
        getattr(caught.value, "inner_exception", caught.value), TracedTallyError
    )
    assert ks.counters.snapshot()["linear"] == {}


def test_a_module_that_does_not_run_fails_compilation() -> None:
    ks = kernels(batch_invariant=False)
    block = Block(ks, idle=True)
    compile_counted([block], ks.counters, inner="eager")
    with pytest.raises(Exception, match="runs .* eagerly"):
        block(torch.randn(1, 8, 32))


def test_a_graph_break_fails_compilation() -> None:
    class Breaking(Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            torch._dynamo.graph_break()
            return super().forward(x)

    ks = kernels(batch_invariant=False)
    block = Breaking(ks)
    compile_counted([block], ks.counters, inner="eager")
    with pytest.raises(Exception, match="graph_break|graph break"):
        block(torch.randn(1, 8, 32))


def test_names() -> None:
    assert module_path("L['self'].img_mlp[0]") == "img_mlp.0"
    assert module_path("L['self'].blocks._modules['3'].qkv") == "blocks.3.qkv"
    assert op_name(torch.ops.aten.mm.default) == "aten.mm"
    assert op_name(torch._C._nn.linear) == "linear"
    assert (
        op_name(torch.ops.aten._scaled_dot_product_cudnn_attention.default)
        == "aten._scaled_dot_product_cudnn_attention"
    )
