"""Attention backends by name. Implementations are imported only when chosen."""

from __future__ import annotations

import torch

from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.backend import BackendRegistry

# name -> "module:Class". "math" is a reference and never chosen by auto.
ATTENTION_BACKENDS: dict[str, str] = {
    "flash_attn": "diffserve.layers.attention.flash:FlashAttentionBackend",
    "sdpa": "diffserve.layers.attention.sdpa:SdpaAttentionBackend",
    "math": "diffserve.layers.attention.math:MathAttentionBackend",
}
# auto prefers flash_attn (CUDA, half precision, package installed) and falls back to sdpa.
AUTO_PREFERENCE = ("flash_attn", "sdpa")
REGISTRY: BackendRegistry[AttentionBackend] = BackendRegistry("attention", ATTENTION_BACKENDS, AUTO_PREFERENCE)


def attention_backend_names() -> list[str]:
    return REGISTRY.names()


def get_attention_backend_class(name: str) -> type[AttentionBackend]:
    return REGISTRY.get_class(name)


def select_attention_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    """Return a backend instance for ``name`` on ``device``/``dtype`` (module-level so tests can wrap it)."""
    return REGISTRY.select(name, device, dtype)
