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
    """Embeds a per-sample vector ``[B, in_dim]``; row by row, so a sample's result ignores its batch."""

    def __init__(self, in_dim: int, hidden_dim: int, kernels: KernelSet) -> None:
        super().__init__()
        self.in_layer = kernels.make_linear(in_dim, hidden_dim, rowwise=True)
        self.out_layer = kernels.make_linear(hidden_dim, hidden_dim, rowwise=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_layer(F.silu(self.in_layer(x)))


def rope(ids: Tensor, axes_dim: tuple[int, ...], theta: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Rotation table ``[2, L, head_dim]`` for ``ids`` of shape ``[L, n_axes]``: row 0 is cos, row 1 is sin with
    the sign of the pair rotation folded in (``-sin, +sin`` per channel pair), as ``apply_rope`` consumes it.

    Computed once per request in float64 (as the reference does) and cast, keeping float64 off the
    per-step path.
    """
    angles = []
    for axis, dim in enumerate(axes_dim):
        scale = torch.arange(0, dim, 2, dtype=torch.float64, device=ids.device) / dim
        omega = 1.0 / theta**scale
        angles.append(ids[:, axis].to(torch.float64)[:, None] * omega[None])
    angle = torch.cat(angles, dim=-1)
    cos = angle.cos().repeat_interleave(2, dim=-1)
    sin = torch.stack((-angle.sin(), angle.sin()), dim=-1).flatten(-2)
    return torch.stack((cos, sin)).to(dtype)


def apply_rope(x: Tensor, pe: Tensor) -> Tensor:
    """Rotate consecutive channel pairs of ``x`` ``[B, L, ..., D]`` by the angles in ``pe`` (from ``rope``).

    ``out = x * cos + swap_pairs(x) * signed_sin``: three kernels, done in float32 for half-precision input.
    """
    shape = (pe.shape[1],) + (1,) * (x.ndim - 3) + (pe.shape[2],)
    cos, sin = pe[0].view(shape), pe[1].view(shape)
    xf = x if x.dtype == pe.dtype else x.to(pe.dtype)
    swapped = xf.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return torch.addcmul(xf * cos, swapped, sin).to(x.dtype)
