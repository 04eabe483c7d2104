"""Attention through ``torch.nn.functional.scaled_dot_product_attention`` (torch picks
the kernel)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffserve.layers.attention.base import AttentionBackend


class SdpaAttentionBackend(AttentionBackend):
    name = "sdpa"

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).flatten(2)
