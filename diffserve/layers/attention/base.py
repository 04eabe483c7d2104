"""The contract every attention backend implements."""

from __future__ import annotations

import torch

from diffserve.layers.backend import KernelBackend


class AttentionBackend(KernelBackend):
    """Non-causal, unmasked multi-head attention with scale ``head_dim ** -0.5``.

    ``attention(q, k, v)`` takes ``[B, H, L, D]`` tensors (any strides) and returns ``[B, L, H * D]``,
    the layout the output projection consumes, so each backend picks its own cheapest transpose.
    """

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
