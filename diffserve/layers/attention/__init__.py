"""Attention call sites and their backend registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffserve.layers.attention import registry

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from diffserve.layers.attention.base import AttentionBackend

__all__ = ["select_attention_backend"]


def select_attention_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    """Same as ``registry.select_attention_backend``, looked up at call time so patching either name works."""
    return registry.select_attention_backend(name, device, dtype)
