"""FLUX's single block with merged projections (``SingleStreamBlock.fuse_projections``,
what a GPU deployment runs): the same math as the block as loaded (float32 to rounding,
bfloat16 within tolerance), the same counted calls, one GEMM with a GELU tail instead of
two and no concatenation; chosen for GPUs without LoRA."""

from __future__ import annotations

import pytest
import torch
from flux_helpers import flux_transformer

from diffserve.config.resolve import resolve
from diffserve.models.flux.build import fuses_single_blocks


def inputs(g: torch.Generator, batch: int = 2, tokens: int = 16):
    img = torch.randn(batch, tokens, 64, generator=g)
    txt = torch.randn(batch, 8, 64, generator=g)
    img_ids = torch.stack(
        [torch.zeros(tokens), torch.arange(tokens) // 4, torch.arange(tokens) % 4], -1
    )
    return (
        img,
        img_ids.float(),
        txt,
        torch.zeros(8, 3),
        torch.rand(batch, generator=g),
        torch.randn(batch, 32, generator=g),
    )


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("dtype", "min_psnr"), [(torch.float32, 100.0), (torch.bfloat16, 30.0)]
)
def test_fused_single_blocks_are_the_same_math(tiny_flux_dir, dtype, min_psnr) -> None:
    loaded = flux_transformer(tiny_flux_dir / "transformer").to(dtype)
    fused = flux_transformer(tiny_flux_dir / "transformer").to(dtype)
    fused.fuse_single_blocks()
    block = fused.single_blocks[0]
    assert block.fused and not hasattr(block, "qkv") and not hasattr(block, "linear2")
    assert block.linear1.activation_from == 3 * block.hidden_size
    args = inputs(torch.Generator().manual_seed(0))
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    with torch.inference_mode():
        expected, out = loaded(*args).float(), fused(*args).float()
    mse = (out - expected).pow(2).mean()
    psnr = 10 * torch.log10(expected.pow(2).max() / mse) if mse > 0 else torch.inf
    assert psnr >= min_psnr, f"{psnr:.1f} dB"
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)
    # Same calls per backend: linear1 for qkv + mlp_in, linear2 as two halves
    assert fused.counters.snapshot() == loaded.counters.snapshot()


def traced_targets(module, *args) -> list[str]:
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.compile(module, backend=capture, fullgraph=True)(*args)
    nodes = [n for g in graphs for n in g.graph.nodes]
    return [str(n.target) for n in nodes if n.op == "call_function"]


def test_fused_single_block_runs_one_gemm_and_no_concatenation(tiny_flux_dir) -> None:
    model = flux_transformer(tiny_flux_dir / "transformer")
    block = model.single_blocks[0]
    x = torch.randn(1, 24, block.hidden_size)
    vec = torch.randn(1, block.hidden_size)
    pe = model.rope(torch.zeros(8, 3), torch.zeros(16, 3))
    with torch.inference_mode():
        before = traced_targets(block, x, vec, pe, 8)
        block.fuse_projections()
        after = traced_targets(block, x, vec, pe, 8)
    cat = "<built-in method cat of type object"
    assert sum(t.startswith(cat) for t in before) == 1
    assert not any(t.startswith(cat) for t in after)
    # qkv + mlp_in + linear2 + modulation -> linear1 (custom op) + 2 halves + modulation
    assert before.count("<built-in function linear>") == 4
    assert after.count("<built-in function linear>") == 3
    assert after.count("diffserve.gemm_gelu_tail") == 1


def test_gpu_stages_without_lora_fuse(tiny_flux_dir, tmp_path) -> None:
    stage = resolve(model=tiny_flux_dir, platform="cuda", env={}).stages[0]
    assert fuses_single_blocks(stage, torch.device("cuda", 0))
    assert not fuses_single_blocks(stage, torch.device("cpu"))
    adapter = tmp_path / "style.safetensors"
    adapter.write_bytes(b"")
    with_lora = resolve(
        model=tiny_flux_dir,
        overrides={"lora_dir": str(tmp_path)},
        platform="cuda",
        env={},
    ).stages[0]
    assert not fuses_single_blocks(with_lora, torch.device("cuda", 0))
