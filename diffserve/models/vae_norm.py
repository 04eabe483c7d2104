"""The RMS norm of the Wan and Qwen-Image VAEs as a running sum of squares, for CPU
encodes and decodes.

diffusers' ``WanRMS_norm`` and ``QwenImageRMS_norm`` divide by ``F.normalize``'s norm
over the channel dimension. On CPU that norm (``linalg_vector_norm`` over a dimension
that is not the innermost) is a slow kernel: measured on an Intel AMX machine, 12-15 ms
for a ``[8, 16, 4, 64, 64]`` float32 tensor against 0.6-1.0 ms here, 1.9 s against
0.2-0.4 s for a 480x832 Wan2.1 decoder activation, about half of the toy-motion VAE's
decode, and the tiny Qwen-Image VAE's encode of a 1254x836 edit reference 1.9 s against
1.2 s. The sum of squares runs channel by channel in element-wise kernels
(``addcmul_``), not in a reduction kernel, whose summation order is the kernel's own
(threads, vector width, alignment: with ``x.square().sum(1)``, one ``make test`` run saw
an mp worker's Wan video differ by one pixel from the same request in process), so a
pixel is the same whatever the threads and the batch. It rounds differently from
diffusers' norm in the last bit (a few 1e-6 on values ~1): a float32 decode is within
one uint8 level of diffusers', no longer bit for bit (tests/models/test_wan.py).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import Tensor, nn


def channel_norm(x: Tensor, dim: int) -> Tensor:
    """The 2-norm over ``dim`` (kept, size 1), accumulated one channel after another."""
    channels = x.unbind(dim)
    total = channels[0].square()
    for channel in channels[1:]:
        total.addcmul_(channel, channel)
    return total.sqrt_().unsqueeze(dim)


def _forward(self: Any, x: Tensor) -> Tensor:
    # diffusers normalizes half-precision (and float8) inputs in float32; so does this.
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
    norm = channel_norm(wide, 1 if self.channel_first else -1).clamp_min_(1e-12)
    return (wide / norm).to(x.dtype) * self.scale * self.gamma + self.bias


def running_sum_rms_norms(module: nn.Module) -> int:
    """Give every ``WanRMS_norm`` and ``QwenImageRMS_norm`` under ``module`` the
    channel-by-channel norm, in place; how many. (Both compute ``F.normalize(x, dim) *
    scale * gamma + bias``, half precision in float32.)"""
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageRMS_norm
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    changed = 0
    for child in module.modules():
        if isinstance(child, (WanRMS_norm, QwenImageRMS_norm)):
            child.forward = types.MethodType(_forward, child)
            changed += 1
    return changed
