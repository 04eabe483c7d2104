"""Attention backends on a CUDA device (``make gpu-check``; skipped without one): sdpa
and, where the package is installed, flash_attn against the math reference in bfloat16,
and what ``auto`` picks there."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from diffserve.layers.attention.registry import select_attention_backend

pytestmark = pytest.mark.gpu


def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(0)
    return tuple(
        torch.randn(2, 8, 333, 64, generator=g, device="cuda", dtype=torch.bfloat16)
        for _ in range(3)
    )  # type: ignore[return-value]


@pytest.mark.parametrize("name", ["sdpa", "flash_attn"])
def test_cuda_backends_match_math_in_bfloat16(name: str) -> None:
    if name == "flash_attn" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attn is not installed on this machine")
    q, k, v = _qkv()
    out = select_attention_backend(name, "cuda", torch.bfloat16).attention(q, k, v)
    reference = select_attention_backend("math", "cuda", torch.float32).attention(
        q.float(), k.float(), v.float()
    )
    assert out.shape == (2, 333, 8 * 64) and out.device.type == "cuda"
    assert ((out.float() - reference).norm() / reference.norm()) < 2e-2


def test_auto_on_cuda_prefers_flash_attn_when_installed() -> None:
    expected = "flash_attn" if importlib.util.find_spec("flash_attn") else "sdpa"
    assert select_attention_backend("auto", "cuda", torch.bfloat16).name == expected
