"""``Attention``: one attention call site with a role and a backend object fixed at
construction."""

from __future__ import annotations

import torch
from torch import nn

from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.per_sample import each_sample


class Attention(nn.Module):
    """Runs ``backend.attention(q, k, v)`` (``[B, H, L, D]`` in, ``[B, L, H * D]`` out)
    and counts it.

    ``role`` names the call site for per-role backend choice (see docs/backends.md).
    ``per_sample=True`` (a ``batch_invariant`` kernel set, ``layers/per_sample.py``):
    one backend call per sample of the batch.
    """

    def __init__(
        self,
        role: str,
        *,
        backend: AttentionBackend,
        counters: KernelCounters,
        per_sample: bool = False,
    ) -> None:
        super().__init__()
        self.role = role
        self.per_sample = per_sample
        self.backend = backend
        self.backend_name = backend.name
        self.counters = counters

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            self.counters.count_attention(self.backend_name)
        if self.per_sample and q.shape[0] > 1:
            return each_sample(self._run, q, k, v, mask=mask)
        return self._run(q, k, v, mask)

    def _run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if mask is None:
            return self.backend.attention(q, k, v)
        return self.backend.attention(q, k, v, mask)

    def extra_repr(self) -> str:
        return f"role={self.role}, backend={self.backend_name}" + (
            ", per_sample" if self.per_sample else ""
        )
