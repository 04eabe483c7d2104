"""The contract every attention backend implements."""

from __future__ import annotations

import torch

from diffserve.layers.backend import KernelBackend


class AttentionBackend(KernelBackend):
    """Non-causal multi-head attention with scale ``head_dim ** -0.5``.

    ``attention(q, k, v)`` takes ``[B, H, L, D]`` tensors (any strides) and returns
    ``[B, L, H * D]``, the layout the output projection consumes, so each backend picks
    its own cheapest transpose. ``mask`` (only where ``supports_mask``): an additive
    float bias or a boolean keep-mask broadcastable to ``[B, H, Lq, Lk]``, as
    ``scaled_dot_product_attention`` takes it (padded text tokens of a model whose
    encoder pads, e.g. PixArt's cross-attention).
    """

    supports_mask: bool = True

    def refuse_mask(self, mask: torch.Tensor | None) -> None:
        """A backend without ``supports_mask`` refuses a call that passes one (config
        refuses such a role before it runs: ``models/generic/kernels.py``)."""
        if mask is not None:
            raise ValueError(
                f"{self.name} takes no attention mask; "
                "choose sdpa or math for this role"
            )

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError
