"""Timestep/vector embedders and rotary position embeddings (RoPE) for FLUX."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffserve.layers.kernels import KernelSet


def timestep_embedding(t: Tensor, dim: int, max_period: int = 10_000) -> Tensor:
    """Sinusoidal embedding ``[cos, sin]`` of (already scaled) timesteps ``t`` of shape ``[B]``."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden_dim: int, kernels: KernelSet, **factory) -> None:
        super().__init__()
        self.in_layer = kernels.make_linear(in_dim, hidden_dim, **factory)
        self.out_layer = kernels.make_linear(hidden_dim, hidden_dim, **factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_layer(F.silu(self.in_layer(x)))


def rope(ids: Tensor, axes_dim: tuple[int, ...], theta: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Per-position rotation table ``[L, head_dim // 2, 2]`` (cos, sin) for ``ids`` of shape ``[L, n_axes]``.

    Computed once per request in float64 (as the reference does) and cast, keeping float64 off the
    per-step path.
    """
    angles = []
    for axis, dim in enumerate(axes_dim):
        scale = torch.arange(0, dim, 2, dtype=torch.float64, device=ids.device) / dim
        omega = 1.0 / theta**scale
        angles.append(ids[:, axis].to(torch.float64)[:, None] * omega[None])
    angle = torch.cat(angles, dim=-1)
    return torch.stack([angle.cos(), angle.sin()], dim=-1).to(dtype)


def apply_rope(x: Tensor, pe: Tensor) -> Tensor:
    """Rotate consecutive channel pairs of ``x`` ``[B, H, L, D]`` by the angles in ``pe`` ``[L, D/2, 2]``."""
    cos, sin = pe[..., 0], pe[..., 1]
    x_ = x.float().unflatten(-1, (-1, 2))
    x0, x1 = x_[..., 0], x_[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)
    return out.flatten(-2).type_as(x)
