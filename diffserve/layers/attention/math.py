"""Reference attention written out (scores, float32 softmax, weighted sum), for parity
checks."""

from __future__ import annotations

import torch

from diffserve.layers.attention.base import AttentionBackend


class MathAttentionBackend(AttentionBackend):
    name = "math"

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        scale = q.shape[-1] ** -0.5
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if mask is not None:
            scores = (
                scores.masked_fill(~mask, float("-inf"))
                if mask.dtype == torch.bool
                else scores + mask
            )
        # Softmax in float32 so the reference stays exact enough in half precision.
        probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        return torch.matmul(probs, v).transpose(1, 2).flatten(2)
