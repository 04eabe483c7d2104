"""The contract every attention backend implements."""

from __future__ import annotations

from typing import ClassVar

import torch


class AttentionBackend:
    """Non-causal, unmasked multi-head attention with scale ``head_dim ** -0.5``.

    ``attention(q, k, v)`` takes ``[B, H, L, D]`` tensors (any strides) and returns ``[B, L, H * D]``,
    the layout the output projection consumes, so each backend picks its own cheapest transpose.
    """

    name: ClassVar[str] = ""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype

    @classmethod
    def unavailable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        return None

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
