"""Timestep/vector embedders and rotary position embeddings (RoPE) for FLUX."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.weak import WeakIdKeyDictionary

from diffserve.layers.kernels import KernelSet


def timestep_embedding(t: Tensor, dim: int, max_period: int = 10_000) -> Tensor:
    """Sinusoidal embedding ``[cos, sin]`` of (already scaled) timesteps ``t`` of shape
    ``[B]``."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period)
        * torch.arange(half, dtype=torch.float32, device=t.device)
        / half
    )
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class MLPEmbedder(nn.Module):
    """Embeds a per-sample vector ``[B, in_dim]`` (timestep, guidance, pooled text)."""

    def __init__(self, in_dim: int, hidden_dim: int, kernels: KernelSet) -> None:
        super().__init__()
        self.in_layer = kernels.make_linear(in_dim, hidden_dim)
        self.out_layer = kernels.make_linear(hidden_dim, hidden_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_layer(F.silu(self.in_layer(x)))


def rope(
    ids: Tensor,
    axes_dim: tuple[int, ...],
    theta: int,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Rotation table ``[2, L, head_dim]`` for ``ids`` of shape ``[L, n_axes]``: row 0
    is cos, row 1 is sin with the sign of the pair rotation folded in (``-sin, +sin``
    per channel pair), as ``apply_rope`` consumes it.

    Computed once per request in float64 (as the reference does) and cast, keeping
    float64 off the per-step path.
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


# pe table -> its complex form: every block of a forward (and every step of a request)
# rotates by the same table, so it is converted once. Weakly keyed: an entry goes with
# its table.
_ROTATIONS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def rope_rotation(pe: Tensor) -> Tensor:
    """The ``rope`` table as unit complex numbers ``e^{i angle}``, ``[L, head_dim / 2]``
    complex64 (one per pair).

    Cached per table object (recomputed if a non-inference table was changed in
    place)."""
    if torch.compiler.is_compiling():
        return _rotation(pe)
    version = -1 if pe.is_inference() else pe._version
    entry = _ROTATIONS.get(pe)
    if entry is None or entry[0] != version:
        entry = (version, _rotation(pe))
        _ROTATIONS[pe] = entry
    return entry[1]


def _rotation(pe: Tensor) -> Tensor:
    pe = pe.float()
    return torch.complex(pe[0, :, 0::2], pe[1, :, 1::2])


def rotate_(x: Tensor, pe: Tensor, first_row: int = 0) -> Tensor:
    """Rotate consecutive channel pairs of the float32 ``x`` ``[B, L, ..., D]`` by the
    ``L`` rows of the ``rope`` table ``pe`` from ``first_row`` on, in place: one complex
    multiply by ``rope_rotation(pe)``, no swapped copy. Returns the rotated tensor
    (``x`` itself, except under ``torch.compile``: inductor has no complex codegen, so a
    compiled block takes the real form ``x * cos + swap_pairs(x) * signed_sin``, which
    it fuses).

    An offset, not a ``slice``: dynamo pins a slice object's bounds (an equality guard
    on the sequence length, so one recompile per image size); ``narrow`` by a symbolic
    offset and length keeps them symbolic."""
    length = x.shape[1]
    if torch.compiler.is_compiling():
        table = pe.narrow(1, first_row, length).float()
        shape = (table.shape[1],) + (1,) * (x.ndim - 3) + (table.shape[2],)
        swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
        return torch.addcmul(x * table[0].view(shape), swapped, table[1].view(shape))
    rotation = rope_rotation(pe).narrow(0, first_row, length)
    shape = (rotation.shape[0],) + (1,) * (x.ndim - 3) + (rotation.shape[1],)
    torch.view_as_complex(x.unflatten(-1, (-1, 2))).mul_(rotation.view(shape))
    return x


def apply_rope(x: Tensor, pe: Tensor) -> Tensor:
    """Rotate consecutive channel pairs of ``x`` ``[B, L, ..., D]`` by the angles in
    ``pe`` (from ``rope``), in float32 (half-precision input is rounded back once, at
    the end)."""
    xf = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    return rotate_(xf, pe).to(x.dtype)
