from __future__ import annotations

import pytest
import torch

from diffserve.errors import BackendUnavailableError
from diffserve.layers.attention.module import Attention
from diffserve.layers.attention.registry import select_attention_backend
from diffserve.layers.attestation import KernelCounters


def _qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 4, 37, 32, generator=g) for _ in range(3))  # type: ignore[return-value]


def test_math_and_sdpa_agree_in_float32() -> None:
    q, k, v = _qkv()
    sdpa = select_attention_backend("sdpa", "cpu", torch.float32).attention(q, k, v)
    ref = select_attention_backend("math", "cpu", torch.float32).attention(q, k, v)
    assert sdpa.shape == (2, 37, 4 * 32)
    rel = (sdpa - ref).norm() / ref.norm()
    assert rel < 1e-5, rel


def test_output_layout_is_tokens_then_heads() -> None:
    q, k, v = _qkv(1)
    out = select_attention_backend("math", "cpu", torch.float32).attention(q, k, v)
    # Head 2 of token 5 lives at columns [64:96) of row 5.
    scores = torch.softmax((q[0, 2] @ k[0, 2].T) / 32**0.5, dim=-1)
    torch.testing.assert_close(
        out[0, 5, 64:96], (scores @ v[0, 2])[5], rtol=1e-5, atol=1e-6
    )


def test_auto_is_sdpa_on_cpu() -> None:
    assert select_attention_backend("auto", "cpu", torch.float32).name == "sdpa"
    assert select_attention_backend("auto", "cpu", torch.bfloat16).name == "sdpa"


def test_flash_attn_on_cpu_names_what_is_missing() -> None:
    with pytest.raises(BackendUnavailableError) as info:
        select_attention_backend("flash_attn", "cpu", torch.float32)
    text = str(info.value)
    assert "flash_attn" in text and "CUDA device" in text and "float16/bfloat16" in text


def test_unknown_attention_backend() -> None:
    with pytest.raises(
        BackendUnavailableError, match="valid: auto, sdpa, math, flash_attn"
    ):
        select_attention_backend("xformers9", "cpu", torch.float32)


def test_attention_module_records_and_counts() -> None:
    counters = KernelCounters()
    attn = Attention(
        "double_block",
        backend=select_attention_backend("sdpa", "cpu", torch.float32),
        counters=counters,
    )
    attn(*_qkv())
    assert (attn.role, attn.backend_name) == ("double_block", "sdpa")
    assert counters.snapshot()["attention"] == {"sdpa": 1}
