"""Wan's position and time embeddings: the 3D rotary table over (frame, row, column)
tokens and the sinusoidal timestep features, computed as diffusers'
``WanRotaryPosEmbed`` and ``Timesteps`` do (float64 frequencies, float32 tables), so the
native transformer matches diffusers' to rounding."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _axis_frequencies(
    dim: int, positions: int, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """cos and sin ``[positions, dim // 2]`` of one rotary axis (one value per channel
    pair)."""
    # On the CPU explicitly: a transformer is built under ``torch.device("meta")`` and
    # loaded afterwards.
    freqs = 1.0 / (
        theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim)
    )
    angles = torch.outer(torch.arange(positions, device="cpu"), freqs)
    return angles.cos().float(), angles.sin().float()


class RotaryTable:
    """Per-axis rotary frequencies of one transformer (head_dim split as diffusers:
    frames get what the two spatial axes, ``2 * (head_dim // 6)`` channels each,
    leave)."""

    def __init__(self, head_dim: int, max_positions: int) -> None:
        spatial = 2 * (head_dim // 6)
        self.splits = (head_dim - 2 * spatial, spatial, spatial)
        self.axes = [_axis_frequencies(dim, max_positions) for dim in self.splits]
        self.max_positions = max_positions

    def table(
        self, frames: int, height: int, width: int, device: torch.device
    ) -> tuple[Tensor, Tensor]:
        """cos and sin ``[1, frames * height * width, 1, head_dim // 2]`` for a token
        grid (tokens in frame-major, then row, then column order, as the patch embedding
        flattens them)."""
        if max(frames, height, width) > self.max_positions:
            raise ValueError(
                f"a {frames}x{height}x{width} token grid is beyond the rotary table's "
                f"{self.max_positions} positions per axis (rope_max_seq_len)"
            )
        sizes = (frames, height, width)
        parts: list[tuple[Tensor, Tensor]] = []
        for axis, (cos, sin) in enumerate(self.axes):
            shape = [1, 1, 1, -1]
            shape[axis] = sizes[axis]
            grid = (frames, height, width, cos.shape[1])
            parts.append(
                (
                    cos[: sizes[axis]].view(shape).expand(grid),
                    sin[: sizes[axis]].view(shape).expand(grid),
                )
            )
        cos = torch.cat([c for c, _ in parts], dim=-1).reshape(
            1, frames * height * width, 1, -1
        )
        sin = torch.cat([s for _, s in parts], dim=-1).reshape(
            1, frames * height * width, 1, -1
        )
        return cos.to(device), sin.to(device)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on ``x`` ``[B, L, H, D]`` with interleaved channel pairs; computed in the
    tables' float32 and rounded once to ``x``'s dtype, as diffusers' Wan processor
    does."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out


def timestep_features(timesteps: Tensor, dim: int) -> Tensor:
    """``[B, dim]`` sinusoidal features of ``timesteps`` (cos first, max period 10000),
    in float32."""
    half = dim // 2
    exponent = (
        -math.log(10000)
        * torch.arange(half, dtype=torch.float32, device=timesteps.device)
        / half
    )
    angles = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    features = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    if dim % 2:
        features = torch.nn.functional.pad(features, (0, 1, 0, 0))
    return features
