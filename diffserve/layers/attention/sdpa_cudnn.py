"""SDPA pinned to cuDNN's fused attention (``aten::_scaled_dot_product_cudnn_attention``
called directly, so neither torch's kernel heuristic nor a context manager decides, and
the traced graph names the kernel). On Hopper at head_dim 128 it is the fastest
attention torch ships (FlashAttention-3-class), where plain ``sdpa`` may pick its
FlashAttention-2 kernel; ``auto`` prefers it there."""

from __future__ import annotations

import torch

from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.attention.cuda_checks import cuda_shortfall, is_hopper

# cuDNN's SDPA graphs need cuDNN 9 and an Ampere or newer GPU.
MIN_CUDNN = 90000
MIN_CAPABILITY = (8, 0)


class SdpaCudnnAttentionBackend(AttentionBackend):
    name = "sdpa_cudnn"
    supports_mask = False

    @classmethod
    def unavailable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        missing = cuda_shortfall(device, dtype, min_capability=MIN_CAPABILITY)
        if not missing:
            version = torch.backends.cudnn.version() or 0
            if version < MIN_CUDNN:
                missing.append(
                    f"it needs cuDNN >= 9 (torch has {version or 'no cuDNN'})"
                )
        return "; ".join(missing) or None

    @classmethod
    def auto_skip_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        if not is_hopper(device):
            return (
                "measured faster than torch's own choice on Hopper (sm90) only; "
                "sdpa decides elsewhere"
            )
        return None

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.refuse_mask(mask)
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False)[
            0
        ]
        return out.transpose(1, 2).flatten(2)
