"""torchao-quantized ``Linear`` layers: each method's output against the float layer,
its calls counted under the method's backend name, its weight bytes, ignore patterns,
and a LoRA delta on top of a quantized GEMM."""

from __future__ import annotations

import math

import pytest
import torch
from cpu_kinds import int8_gemm_unlike_the_kind
from torch import nn

from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear import lora
from diffserve.layers.linear.module import Linear
from diffserve.layers.linear.quantized import ignored, quantize_linears
from diffserve.layers.linear.registry import select_linear_backend
from diffserve.models.memory import module_weight_bytes

pytest.importorskip("torchao")

# method -> (backend counted, least output SNR in dB against float32 at 256 -> 512 on
# Gaussian inputs)
METHODS = {
    "int8": ("int8_dynamic", 35.0),
    "int8_weight_only": ("int8_weight_only", 38.0),
    "fp8_weight_only": ("fp8_weight_only", 28.0),
}


def snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    noise = (reference - other).double().pow(2).mean().item()
    return 10 * math.log10(reference.double().pow(2).mean().item() / noise)


class Block(nn.Module):
    """Two of our Linear layers and one plain nn.Linear, named as a model's would be."""

    def __init__(self, counters: KernelCounters) -> None:
        super().__init__()
        backend = select_linear_backend("auto", "cpu", torch.float32)
        self.proj = Linear(256, 512, backend=backend, counters=counters)
        self.final_layer = nn.Module()
        self.final_layer.linear = Linear(512, 256, backend=backend, counters=counters)
        self.embed = nn.Linear(256, 256)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_method_is_close_to_float_counted_and_smaller(method: str) -> None:
    if method == "int8" and (unlike := int8_gemm_unlike_the_kind()):
        pytest.skip(unlike)
    torch.manual_seed(0)
    counters = KernelCounters()
    block = Block(counters)
    x = torch.randn(2, 16, 256)
    with torch.inference_mode():
        reference = block.proj(x)
    float_bytes, params = module_weight_bytes(block.proj)
    result = quantize_linears(block, method, ignore=("final_layer",))
    backend, least_snr = METHODS[method]
    assert (result.quantized_linears, result.ignored_linears, result.ignored_names) == (
        2,
        1,
        ["final_layer.linear"],
    )
    assert (
        block.proj.backend_name == backend
        and block.final_layer.linear.backend_name != backend
    )
    assert type(block.proj.weight).__name__ in ("Int8Tensor", "Float8Tensor")
    # Ignored: untouched.
    assert isinstance(block.final_layer.linear.weight, nn.Parameter)
    # A plain nn.Linear too.
    assert type(block.embed.weight).__name__ in ("Int8Tensor", "Float8Tensor")
    counters.reset()
    with torch.inference_mode():
        out = block.proj(x)
    assert counters.snapshot()["linear"] == {backend: 1}
    assert snr_db(reference, out) >= least_snr
    # 8-bit data plus per-channel scales: about a quarter of float32's bytes.
    quant_bytes, quant_params = module_weight_bytes(block.proj)
    assert quant_params == params and quant_bytes < 0.3 * float_bytes
    assert result.attested() == {
        "method": method,
        "backend": backend,
        "quantized_linears": 2,
        "ignored_linears": 1,
        "ignored_patterns": ["final_layer"],
    }


def test_none_leaves_every_layer_alone() -> None:
    block = Block(KernelCounters())
    result = quantize_linears(block, "none", ignore=("final_layer",))
    assert result.quantized_linears == 0 and result.attested() is None
    assert isinstance(block.proj.weight, nn.Parameter)


def test_ignore_patterns_match_a_module_or_its_parents() -> None:
    patterns = ("final_layer", "*.img_mod", "double_blocks.1?.txt_mlp.0")
    assert ignored("final_layer.linear", patterns) and ignored("final_layer", patterns)
    assert ignored("double_blocks.3.img_mod.lin", patterns)
    assert ignored("double_blocks.12.txt_mlp.0", patterns) and not ignored(
        "double_blocks.2.txt_mlp.0", patterns
    )
    assert not ignored("final_layer_norm", patterns) and not ignored(
        "img_mod", patterns
    )


def test_a_lora_delta_adds_to_the_quantized_gemm() -> None:
    torch.manual_seed(1)
    counters = KernelCounters()
    layer = Linear(
        64,
        32,
        backend=select_linear_backend("auto", "cpu", torch.float32),
        counters=counters,
    )
    quantize_linears(layer, "int8_weight_only")
    x = torch.randn(1, 8, 64)
    a, b = torch.randn(4, 64) * 0.1, torch.randn(32, 4) * 0.1
    with torch.inference_mode():
        base = layer(x)
        layer.set_lora(lora.LoraState(active=True), a, b)
        patched = layer(x)
    torch.testing.assert_close(patched, base + (x @ a.T) @ b.T, rtol=1e-5, atol=1e-5)
    assert (
        counters.snapshot()["linear"] == {"int8_weight_only": 2}
        and counters.lora_linear_calls == 1
    )
