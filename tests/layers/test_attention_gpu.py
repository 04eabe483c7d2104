"""Attention backends on a CUDA device (``make gpu-check``; skipped without one): each
backend that can run there (sdpa; sdpa_cudnn on Ampere or newer with cuDNN 9; flash_attn
and fa3 where installed) against the math reference in bfloat16, on the strided views a
FLUX block passes, and what ``auto`` picks there."""

from __future__ import annotations

import pytest
import torch

from diffserve.layers.attention.registry import REGISTRY, select_attention_backend

pytestmark = pytest.mark.gpu


def _qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``[B, H, L, D]`` as FLUX's joint buffer yields them: transposed views of
    one ``[B, L, 3, H, D]`` tensor (head_dim 128, FLUX's)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    joint = torch.randn(
        2, 333, 3, 8, 128, generator=g, device="cuda", dtype=torch.bfloat16
    )
    q, k, v = joint.unbind(2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


@pytest.mark.parametrize("name", ["sdpa", "sdpa_cudnn", "flash_attn", "fa3"])
def test_cuda_backends_match_math_in_bfloat16(name: str) -> None:
    reason = REGISTRY.get_class(name).unavailable_reason(
        torch.device("cuda", 0), torch.bfloat16
    )
    if reason is not None:
        pytest.skip(f"{name} cannot run here: {reason}")
    q, k, v = _qkv()
    out = select_attention_backend(name, "cuda", torch.bfloat16).attention(q, k, v)
    reference = select_attention_backend("math", "cuda", torch.float32).attention(
        q.float(), k.float(), v.float()
    )
    assert out.shape == (2, 333, 8 * 128) and out.device.type == "cuda"
    assert ((out.float() - reference).norm() / reference.norm()) < 2e-2


def test_auto_on_cuda_takes_the_first_runnable_preference() -> None:
    device = torch.device("cuda", 0)
    expected = next(
        name
        for name in REGISTRY.auto_preference
        if REGISTRY.get_class(name).unavailable_reason(device, torch.bfloat16) is None
        and REGISTRY.get_class(name).auto_skip_reason(device, torch.bfloat16) is None
    )
    assert select_attention_backend("auto", "cuda", torch.bfloat16).name == expected
    if torch.cuda.get_device_capability(0)[0] == 9:
        assert expected in ("fa3", "sdpa_cudnn")
