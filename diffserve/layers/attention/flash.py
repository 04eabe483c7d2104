"""FlashAttention 2 (``flash_attn`` package); CUDA and float16/bfloat16 only."""

from __future__ import annotations

import importlib.util

import torch

from diffserve.layers.attention.base import AttentionBackend


class FlashAttentionBackend(AttentionBackend):
    name = "flash_attn"
    # Flash_attn_func has no mask argument (varlen packing would be needed)
    supports_mask = False

    @classmethod
    def unavailable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        missing = []
        if importlib.util.find_spec("flash_attn") is None:
            missing.append(
                "the flash_attn package is not installed (pip install flash-attn)"
            )
        if device.type != "cuda":
            missing.append(f"it needs a CUDA device, but the device is {device.type!r}")
        elif not torch.cuda.is_available():
            missing.append(
                "it needs a CUDA device, but torch.cuda.is_available() is False"
            )
        if dtype not in (torch.float16, torch.bfloat16):
            missing.append(
                "it supports float16/bfloat16 only, but the dtype is "
                f"{str(dtype).removeprefix('torch.')}"
            )
        return "; ".join(missing) or None

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device, dtype)
        from flash_attn import flash_attn_func

        self._flash_attn_func = flash_attn_func

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.refuse_mask(mask)
        # flash_attn wants [B, L, H, D]; a transpose view keeps the last dim contiguous,
        # which it needs.
        out = self._flash_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        )
        return out.flatten(2)
