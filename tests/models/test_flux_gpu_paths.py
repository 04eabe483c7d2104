"""The GPU paths of issue 62 on a CUDA device (``make gpu-check``; skipped without one):
the fused single blocks compiled (static shapes) against eager in bfloat16 with the
traced counts equal to the eager ones, int8's own GEMM against torchao's, and fp8 with
per-row scales compiled."""

from __future__ import annotations

import pytest
import torch
from flux_helpers import flux_transformer

pytestmark = pytest.mark.gpu


def _args(tokens: int = 64):
    """img, img_ids, txt, txt_ids, timesteps, y on the GPU (the ids stay float32)."""
    g = torch.Generator().manual_seed(0)
    img_ids = torch.stack(
        [torch.zeros(tokens), torch.arange(tokens) // 8, torch.arange(tokens) % 8], -1
    )

    def half(t: torch.Tensor) -> torch.Tensor:
        return t.to("cuda", torch.bfloat16)

    return (
        half(torch.randn(1, tokens, 64, generator=g)),
        img_ids.float().to("cuda"),
        half(torch.randn(1, 8, 64, generator=g)),
        torch.zeros(8, 3, device="cuda"),
        half(torch.tensor([0.5])),
        half(torch.randn(1, 32, generator=g)),
    )


def _on_gpu(model):
    return model.to("cuda", torch.bfloat16)


def test_fused_compiled_blocks_match_eager_and_count_the_same(tiny_flux_dir) -> None:
    eager = _on_gpu(flux_transformer(tiny_flux_dir / "transformer"))
    compiled = _on_gpu(flux_transformer(tiny_flux_dir / "transformer"))
    compiled.fuse_single_blocks()
    compiled.compile_blocks(mode=None, dynamic=False)
    args = _args()
    with torch.inference_mode():
        expected, out = eager(*args).float(), compiled(*args).float()
    assert ((out - expected).norm() / expected.norm()) < 3e-2
    assert compiled.counters.snapshot() == eager.counters.snapshot()
    assert compiled.traced_ops()["diffserve.gemm_gelu_tail"] == 1


def test_int8_gemm_on_cuda_matches_torchao() -> None:
    pytest.importorskip("torchao")
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    from diffserve.layers.linear.int8_mm import int8_dynamic_linear

    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 384).to("cuda", torch.bfloat16).eval()
    quantize_(layer, Int8DynamicActivationInt8WeightConfig())
    for rows in (1, 40):  # one row: padded to cuBLAS's minimum
        x = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            ours = int8_dynamic_linear(x, layer.weight, layer.bias).float()
            theirs = torch.nn.functional.linear(x, layer.weight, layer.bias).float()
        assert ((ours - theirs).norm() / theirs.norm()) < 2e-2


def test_fp8_rowwise_compiled_block_runs_and_counts(tiny_flux_dir) -> None:
    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability(0) < (8, 9):
        pytest.skip("fp8 needs compute capability >= 8.9")
    from diffserve.layers.linear.quantized import quantize_linears

    model = _on_gpu(flux_transformer(tiny_flux_dir / "transformer"))
    model.fuse_single_blocks()
    result = quantize_linears(model, "fp8", ("*_mod.lin", "*.modulation.lin"))
    assert result.quantized_linears > 0 and result.ignored_linears > 0
    model.compile_blocks(mode=None, dynamic=False)
    args = _args()
    with torch.inference_mode():
        out = model(*args)
    assert torch.isfinite(out.float()).all()
    assert model.counters.snapshot()["linear"]["fp8_dynamic"] > 0
