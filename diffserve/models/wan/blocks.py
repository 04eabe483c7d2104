"""Wan's transformer block on our kernels: self-attention over the video tokens (QK
RMS-norm across heads, 3D RoPE), cross-attention to the UMT5 tokens, a tanh-GELU
feed-forward, each branch modulated by the timestep through the block's
``scale_shift_table``.

Module and parameter names are diffusers' (``WanTransformerBlock``), so a diffusers
checkpoint loads by name. Where diffusers computes in float32 inside a bfloat16 model
(the layer norms, the modulation, the residual adds) this does too, so the two agree to
rounding in both dtypes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffserve.layers.attention.module import Attention
from diffserve.layers.kernels import KernelSet
from diffserve.layers.ulysses import UlyssesAttention
from diffserve.models.wan.embeddings import rotate


class RMSNorm(nn.Module):
    """``torch.nn.RMSNorm`` over the whole projection (every head at once: Wan's
    ``rms_norm_across_heads``)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class LayerNorm32(nn.Module):
    """A LayerNorm computed in float32 (diffusers' ``FP32LayerNorm``), affine or not;
    returns float32."""

    def __init__(self, dim: int, eps: float, affine: bool) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        weight = self.weight.float() if self.weight is not None else None
        bias = self.bias.float() if self.bias is not None else None
        return F.layer_norm(x.float(), (self.dim,), weight, bias, self.eps)


class WanAttention(nn.Module):
    """Q/K/V projections, QK-norm, RoPE (self-attention only) and the output projection
    around one attention call of ``role``; ``forward(x, context)`` attends from ``x`` to
    ``context`` (``None``: to itself)."""

    def __init__(
        self, dim: int, num_heads: int, eps: float, kernels: KernelSet, role: str
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.to_q = kernels.make_linear(dim, dim)
        self.to_k = kernels.make_linear(dim, dim)
        self.to_v = kernels.make_linear(dim, dim)
        self.to_out = nn.ModuleList([kernels.make_linear(dim, dim)])
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)
        self.attn: Attention | UlyssesAttention = kernels.make_attention(role)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        source = x if context is None else context
        q = self.norm_q(self.to_q(x)).unflatten(2, (self.num_heads, -1))
        k = self.norm_k(self.to_k(source)).unflatten(2, (self.num_heads, -1))
        v = self.to_v(source).unflatten(2, (self.num_heads, -1))
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        # Under Ulysses (WanTransformer.shard_sequence) self-attention exchanges heads
        # for this rank's video tokens (no text in its sequence); cross-attention needs
        # no exchange: the text is on every rank.
        out = (
            self.attn(q, k, v, 0)
            if isinstance(self.attn, UlyssesAttention)
            else self.attn(q, k, v)
        )
        return self.to_out[0](out.type_as(q))


class GeluProjection(nn.Module):
    """diffusers' ``GELU`` module (a projection then tanh-GELU), the GELU fused into the
    projection's backend."""

    def __init__(self, dim: int, inner: int, kernels: KernelSet) -> None:
        super().__init__()
        self.proj = kernels.make_linear(dim, inner, activation="gelu_tanh")

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


class FeedForward(nn.Module):
    """``net.0`` (projection + GELU), ``net.1`` (dropout: nothing at inference),
    ``net.2`` (projection)."""

    def __init__(self, dim: int, inner: int, kernels: KernelSet) -> None:
        super().__init__()
        self.net = nn.ModuleList(
            [
                GeluProjection(dim, inner, kernels),
                nn.Identity(),
                kernels.make_linear(inner, dim),
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net[2](self.net[0](x))


class WanBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        ffn_dim: int,
        num_heads: int,
        cross_attn_norm: bool,
        eps: float,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        self.norm1 = LayerNorm32(dim, eps, affine=False)
        self.attn1 = WanAttention(dim, num_heads, eps, kernels, "self_attention")
        self.attn2 = WanAttention(dim, num_heads, eps, kernels, "cross_attention")
        self.norm2 = LayerNorm32(dim, eps, affine=True) if cross_attn_norm else None
        self.ffn = FeedForward(dim, ffn_dim, kernels)
        self.norm3 = LayerNorm32(dim, eps, affine=False)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        modulation: Tensor,
        rope: tuple[Tensor, Tensor],
    ) -> Tensor:
        """``x`` ``[B, L, dim]``, ``context`` ``[B, L_text, dim]``, ``modulation`` ``[B,
        6, dim]`` (the transformer's timestep projection), ``rope`` the cos/sin tables
        of ``x``'s tokens."""
        shift, scale, gate, c_shift, c_scale, c_gate = (
            self.scale_shift_table + modulation.float()
        ).chunk(6, dim=1)
        # The residual adds run in float32 by type promotion (``gate`` is float32): the
        # values of diffusers' explicit ``x.float() + ...``, without writing a float32
        # copy of ``x`` first.
        h = (self.norm1(x) * (1 + scale) + shift).type_as(x)
        x = (x + self.attn1(h, None, rope) * gate).type_as(x)
        h = self.norm2(x).type_as(x) if self.norm2 is not None else x
        x = x + self.attn2(h, context)
        h = (self.norm3(x) * (1 + c_scale) + c_shift).type_as(x)
        return (x + self.ffn(h) * c_gate).type_as(x)
