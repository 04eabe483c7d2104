"""Attention backends by name (the table is
``registry.backends.ATTENTION_BACKENDS``)."""

from __future__ import annotations

import torch

from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.backend import BackendRegistry
from diffserve.registry.backends import ATTENTION_BACKENDS

REGISTRY: BackendRegistry[AttentionBackend] = BackendRegistry(ATTENTION_BACKENDS)


def select_attention_backend(
    name: str, device: torch.device | str, dtype: torch.dtype
) -> AttentionBackend:
    """A backend instance for ``name`` on ``device``/``dtype`` (``auto``: the first that
    can run)."""
    return REGISTRY.select(name, device, dtype)
