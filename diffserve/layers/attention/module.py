"""``Attention``: one attention call site with a role and a backend object fixed at construction."""

from __future__ import annotations

import torch
from torch import nn

from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.attestation import KernelCounters


class Attention(nn.Module):
    """Runs ``backend.attention(q, k, v)`` (``[B, H, L, D]`` in, ``[B, L, H * D]`` out) and counts it.

    ``role`` names the call site for per-role backend choice (see docs/backends.md).
    """

    def __init__(self, role: str, *, backend: AttentionBackend, counters: KernelCounters) -> None:
        super().__init__()
        self.role = role
        self.backend = backend
        self.backend_name = backend.name
        self.counters = counters

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            self.counters.count_attention(self.backend_name)
        if mask is None:
            return self.backend.attention(q, k, v)
        return self.backend.attention(q, k, v, mask)

    def extra_repr(self) -> str:
        return f"role={self.role}, backend={self.backend_name}"
