"""FLUX building blocks: modulation, QK-norm attention projections, double- and
single-stream blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffserve.layers.kernels import KernelSet
from diffserve.layers.linear.module import Linear
from diffserve.layers.ulysses import UlyssesAttention
from diffserve.models.flux.embeddings import rotate_


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.scale.shape, self.scale, eps=1e-6)


class QKNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)

    def forward(self, qk: Tensor) -> Tensor:
        """RMS-normalize ``qk`` ``[B, L, 2, H, D]`` (queries then keys) in one pass,
        each with its own scale."""
        return F.rms_norm(qk, qk.shape[-1:], eps=1e-6) * self.scales(qk.dtype)

    def scales(self, dtype: torch.dtype) -> Tensor:
        """The query and key scales as ``[2, 1, D]`` (broadcasting over ``[..., 2, H,
        D]``)."""
        return torch.stack((self.query_norm.scale, self.key_norm.scale))[:, None, :].to(
            dtype
        )


def norm_rope_into(
    out: Tensor, qk: Tensor, norm: QKNorm, pe: Tensor, first_row: int = 0
) -> None:
    """QK-norm, then RoPE (the ``L`` rows of the ``rope`` table ``pe`` from
    ``first_row``), of ``qk`` ``[B, L, 2, H, D]`` (any strides), written into ``out``
    (same shape, any strides, e.g. a slice of the joint attention buffer).

    One float32 chain (mean square, scale, complex rotate) and one rounding at the end:
    a half-precision ``qk`` is neither rounded between the norm and the rotation nor
    copied by a separate ``cat``.
    """
    # A float32 copy of half-precision input; float32 input itself (then only read)
    xf = qk.float()
    inv_rms = (
        torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
        .square_()
        .div_(qk.shape[-1])
        .add_(1e-6)
        .rsqrt_()
    )
    y = xf.mul_(inv_rms) if xf is not qk else torch.mul(xf, inv_rms)
    out.copy_(rotate_(y.mul_(norm.scales(torch.float32)), pe, first_row))


def layer_norm(x: Tensor) -> Tensor:
    """LayerNorm without affine parameters (eps 1e-6), the pre-norm of every FLUX
    branch."""
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


@dataclass
class ModulationOut:
    shift: Tensor
    scale: Tensor
    gate: Tensor


class Modulation(nn.Module):
    def __init__(self, dim: int, double: bool, kernels: KernelSet) -> None:
        super().__init__()
        self.multiplier = 6 if double else 3
        self.lin = kernels.make_linear(dim, self.multiplier * dim)

    def forward(self, vec: Tensor) -> tuple[ModulationOut, ModulationOut | None]:
        out = self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)
        return ModulationOut(*out[:3]), ModulationOut(
            *out[3:]
        ) if self.multiplier == 6 else None


class SelfAttention(nn.Module):
    """Fused QKV projection + QK-norm + output projection; the attention call itself is
    the block's."""

    def __init__(
        self, dim: int, num_heads: int, qkv_bias: bool, kernels: KernelSet
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = kernels.make_linear(dim, dim * 3, bias=qkv_bias)
        self.norm = QKNorm(dim // num_heads)
        self.proj = kernels.make_linear(dim, dim)

    def heads(self, x: Tensor) -> Tensor:
        """``[B, L, dim]`` -> the raw projection as ``[B, L, 3, H, D]`` (a view: "B L (K
        H D) -> B L K H D")."""
        return self.qkv(x).unflatten(-1, (3, self.num_heads, -1))


def attention_inputs(
    parts: list[tuple[Tensor, QKNorm]], pe: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v ``[B, H, L, D]`` of the joint sequence from its ``(qkv [B, L_i, 3, H, D],
    norm)`` parts in sequence order (text first): QK-norm and RoPE applied, every part
    written straight into one buffer, so the concatenation costs no pass of its own."""
    first = parts[0][0]
    batch, heads, dim = first.shape[0], first.shape[3], first.shape[4]
    length = sum(qkv.shape[1] for qkv, _ in parts)
    joint = first.new_empty(batch, length, 3, heads, dim)
    start = 0
    for qkv, norm in parts:
        rows = joint.narrow(1, start, qkv.shape[1])
        norm_rope_into(rows[:, :, :2], qkv[:, :, :2], norm, pe, start)
        rows[:, :, 2].copy_(qkv[:, :, 2])
        start += qkv.shape[1]
    q, k, v = joint.unbind(2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def attend(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, txt_len: int) -> Tensor:
    """The joint-sequence attention call. Under Ulysses
    (``FluxTransformer.shard_sequence``) the rank holds only an image shard, and the
    exchange must know where the replicated text ends."""
    if isinstance(attn, UlyssesAttention):
        return attn(q, k, v, txt_len)
    return attn(q, k, v)


def modulate(x: Tensor, mod: ModulationOut) -> Tensor:
    """``(1 + scale) * LayerNorm(x) + shift`` as one fused multiply-add."""
    return torch.addcmul(mod.shift, layer_norm(x), 1 + mod.scale)


def mlp(hidden_size: int, mlp_hidden_dim: int, kernels: KernelSet) -> nn.Sequential:
    # The tanh-GELU is the first projection's activation: a backend may fuse it into its
    # GEMM.
    return nn.Sequential(
        kernels.make_linear(hidden_size, mlp_hidden_dim, activation="gelu_tanh"),
        kernels.make_linear(mlp_hidden_dim, hidden_size),
    )


class DoubleStreamBlock(nn.Module):
    """Image and text streams with their own weights, joined for one attention call."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.img_mod = Modulation(hidden_size, double=True, kernels=kernels)
        self.img_attn = SelfAttention(hidden_size, num_heads, qkv_bias, kernels)
        self.img_mlp = mlp(hidden_size, mlp_hidden_dim, kernels)
        self.txt_mod = Modulation(hidden_size, double=True, kernels=kernels)
        self.txt_attn = SelfAttention(hidden_size, num_heads, qkv_bias, kernels)
        self.txt_mlp = mlp(hidden_size, mlp_hidden_dim, kernels)
        self.attn = kernels.make_attention("double_block")

    def forward(
        self, img: Tensor, txt: Tensor, vec: Tensor, pe: Tensor
    ) -> tuple[Tensor, Tensor]:
        img_mod1, img_mod2 = self.img_mod(vec)
        txt_mod1, txt_mod2 = self.txt_mod(vec)

        # prepare image and text for attention
        img_qkv = self.img_attn.heads(modulate(img, img_mod1))
        txt_qkv = self.txt_attn.heads(modulate(txt, txt_mod1))

        # run actual attention over the joint sequence, text first
        q, k, v = attention_inputs(
            [(txt_qkv, self.txt_attn.norm), (img_qkv, self.img_attn.norm)], pe
        )
        attn = attend(self.attn, q, k, v, txt.shape[1])
        txt_attn, img_attn = attn[:, : txt.shape[1]], attn[:, txt.shape[1] :]

        # calculate the img and txt blocks
        img = torch.addcmul(img, img_mod1.gate, self.img_attn.proj(img_attn))
        img = torch.addcmul(img, img_mod2.gate, self.img_mlp(modulate(img, img_mod2)))
        txt = torch.addcmul(txt, txt_mod1.gate, self.txt_attn.proj(txt_attn))
        txt = torch.addcmul(txt, txt_mod2.gate, self.txt_mlp(modulate(txt, txt_mod2)))
        return img, txt


class SingleStreamBlock(nn.Module):
    """Parallel attention and MLP over the joint sequence.

    As loaded, the reference's first projection (Q/K/V and MLP-in as one GEMM) is two,
    ``qkv`` and ``mlp_in``, so the MLP's tanh-GELU is ``mlp_in``'s own activation
    (fused into its GEMM by a backend that can, e.g. oneDNN's post-op on a CPU), and the
    output projection ``linear2`` takes their concatenation. ``fuse_projections`` (a
    GPU deployment's choice, ``models/flux/build.py``) turns that into one merged
    ``linear1`` GEMM whose GELU covers only the MLP's columns
    (``diffserve::gemm_gelu_tail``) and ``linear2`` split by its input into
    ``linear2_attn`` and ``linear2_mlp``, so nothing is concatenated: the same math,
    one GEMM fewer, one copy of the joint sequence fewer per block.
    """

    def __init__(
        self, hidden_size: int, num_heads: int, mlp_ratio: float, kernels: KernelSet
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.qkv = kernels.make_linear(hidden_size, hidden_size * 3)
        self.mlp_in = kernels.make_linear(
            hidden_size, self.mlp_hidden_dim, activation="gelu_tanh"
        )
        self.linear2 = kernels.make_linear(
            hidden_size + self.mlp_hidden_dim, hidden_size
        )
        self.norm = QKNorm(hidden_size // num_heads)
        self.modulation = Modulation(hidden_size, double=False, kernels=kernels)
        self.attn = kernels.make_attention("single_block")
        self.fused = False

    def fuse_projections(self) -> None:
        """Replace ``qkv`` + ``mlp_in`` by ``linear1`` and ``linear2`` by its two input
        halves (before any quantization: every layer keeps a dense weight)."""
        if self.fused:
            return
        qkv, mlp_in, linear2 = self.qkv, self.mlp_in, self.linear2
        h = self.hidden_size

        def like(src: Linear, weight: Tensor, bias: Tensor | None, **kw: Any) -> Linear:
            layer = Linear(
                weight.shape[1],
                weight.shape[0],
                bias is not None,
                backend=src.backend,
                counters=src.counters,
                per_sample=src.per_sample,
                device="meta",
                dtype=weight.dtype,
                **kw,
            )
            layer.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
            if bias is not None:
                layer.bias = nn.Parameter(bias.contiguous(), requires_grad=False)
            return layer

        assert qkv.bias is not None and mlp_in.bias is not None
        self.linear1 = like(
            qkv,
            torch.cat((qkv.weight, mlp_in.weight)),
            torch.cat((qkv.bias, mlp_in.bias)),
            activation="gelu_tanh",
            activation_from=3 * h,
        )
        self.linear2_attn = like(linear2, linear2.weight[:, :h], None)
        self.linear2_mlp = like(linear2, linear2.weight[:, h:], linear2.bias)
        del self.qkv, self.mlp_in, self.linear2
        self.fused = True

    def forward(self, x: Tensor, vec: Tensor, pe: Tensor, txt_len: int = 0) -> Tensor:
        mod, _ = self.modulation(vec)
        x_mod = modulate(x, mod)
        if self.fused:
            merged = self.linear1(x_mod)  # [B, L, 3 * h + mlp]: GELU on the mlp part
            qkv, mlp_act = merged.split((3 * self.hidden_size, self.mlp_hidden_dim), -1)
        else:
            qkv, mlp_act = self.qkv(x_mod), self.mlp_in(x_mod)
        qkv = qkv.unflatten(-1, (3, self.num_heads, -1))
        attn = attend(self.attn, *attention_inputs([(qkv, self.norm)], pe), txt_len)
        if self.fused:
            output = self.linear2_mlp(mlp_act) + self.linear2_attn(attn)
        else:
            output = self.linear2(torch.cat((attn, mlp_act), dim=2))
        return torch.addcmul(x, mod.gate, output)


class LastLayer(nn.Module):
    def __init__(self, hidden_size: int, out_channels: int, kernels: KernelSet) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(
            nn.SiLU(), kernels.make_linear(hidden_size, 2 * hidden_size)
        )
        self.linear = kernels.make_linear(hidden_size, out_channels)

    def forward(self, x: Tensor, vec: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(vec)[:, None, :].chunk(2, dim=-1)
        return self.linear(torch.addcmul(shift, layer_norm(x), 1 + scale))
