"""The Wan VAE's RMS norm as a sum of squares, for CPU decodes.

diffusers' ``WanRMS_norm`` divides by ``F.normalize``'s norm over the channel dimension. On CPU that norm
(``linalg_vector_norm`` over a dimension that is not the innermost) is a slow kernel: measured on an Intel AMX
machine, 30.6 ms for a ``[8, 16, 4, 64, 64]`` float32 tensor against 0.7 ms for the same norm as
``x.square().sum(1)``, and about half of the toy-motion VAE's decode. The two round differently in the last bit
(at most a few 1e-6 on values ~1 here), so a decode is no longer diffusers' bit for bit in float32; a
frame's uint8 pixels stay within rounding of it (tests/models/test_wan.py).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import Tensor, nn


def _forward(self: Any, x: Tensor) -> Tensor:
    # diffusers normalizes half-precision (and float8) inputs in float32; so does this.
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
    norm = wide.square().sum(1 if self.channel_first else -1, keepdim=True).sqrt().clamp_min(1e-12)
    return (wide / norm).to(x.dtype) * self.scale * self.gamma + self.bias


def sum_of_squares_rms_norms(vae: nn.Module) -> int:
    """Give every ``WanRMS_norm`` under ``vae`` the sum-of-squares norm, in place; how many."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    changed = 0
    for module in vae.modules():
        if isinstance(module, WanRMS_norm):
            module.forward = types.MethodType(_forward, module)
            changed += 1
    return changed
