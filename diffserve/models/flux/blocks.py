"""FLUX building blocks: modulation, QK-norm attention projections, double- and single-stream blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffserve.layers.kernels import KernelSet
from diffserve.layers.ulysses import UlyssesAttention
from diffserve.models.flux.embeddings import apply_rope


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
        """RMS-normalize ``qk`` ``[B, L, 2, H, D]`` (queries then keys) in one pass, each with its own scale."""
        scale = torch.stack((self.query_norm.scale, self.key_norm.scale))[:, None, :]
        return F.rms_norm(qk, qk.shape[-1:], eps=1e-6) * scale


def layer_norm(x: Tensor) -> Tensor:
    """LayerNorm without affine parameters (eps 1e-6), the pre-norm of every FLUX branch."""
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
        self.lin = kernels.make_linear(dim, self.multiplier * dim, rowwise=True)

    def forward(self, vec: Tensor) -> tuple[ModulationOut, ModulationOut | None]:
        out = self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)
        return ModulationOut(*out[:3]), ModulationOut(*out[3:]) if self.multiplier == 6 else None


class SelfAttention(nn.Module):
    """Fused QKV projection + QK-norm + output projection; the attention call itself is the block's."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, kernels: KernelSet) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = kernels.make_linear(dim, dim * 3, bias=qkv_bias)
        self.norm = QKNorm(dim // num_heads)
        self.proj = kernels.make_linear(dim, dim)

    def qk_v(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, L, dim]`` -> (normed queries and keys ``[B, L, 2, H, D]``, values ``[B, L, H, D]``)."""
        return split_qkv(self.qkv(x), self.num_heads, self.norm)


def split_qkv(qkv: Tensor, num_heads: int, norm: QKNorm) -> tuple[Tensor, Tensor]:
    # "B L (K H D) -> B L K H D" is a view; q and k stay together so norm and RoPE run once for both.
    qkv = qkv.unflatten(-1, (3, num_heads, -1))
    return norm(qkv[:, :, :2]), qkv[:, :, 2]


def heads_first(qk: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``[B, L, 2, H, D]`` and ``[B, L, H, D]`` -> q, k, v as ``[B, H, L, D]`` views (no copies)."""
    return qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), v.transpose(1, 2)


def attend(attn: nn.Module, q: Tensor, k: Tensor, v: Tensor, txt_len: int) -> Tensor:
    """The joint-sequence attention call. Under Ulysses (``FluxTransformer.shard_sequence``) the rank
    holds only an image shard, and the exchange must know where the replicated text ends."""
    if isinstance(attn, UlyssesAttention):
        return attn(q, k, v, txt_len)
    return attn(q, k, v)


def modulate(x: Tensor, mod: ModulationOut) -> Tensor:
    """``(1 + scale) * LayerNorm(x) + shift`` as one fused multiply-add."""
    return torch.addcmul(mod.shift, layer_norm(x), 1 + mod.scale)


def mlp(hidden_size: int, mlp_hidden_dim: int, kernels: KernelSet) -> nn.Sequential:
    return nn.Sequential(
        kernels.make_linear(hidden_size, mlp_hidden_dim),
        nn.GELU(approximate="tanh"),
        kernels.make_linear(mlp_hidden_dim, hidden_size),
    )


class DoubleStreamBlock(nn.Module):
    """Image and text streams with their own weights, joined for one attention call."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float, qkv_bias: bool,
                 kernels: KernelSet) -> None:
        super().__init__()
        mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.img_mod = Modulation(hidden_size, double=True, kernels=kernels)
        self.img_attn = SelfAttention(hidden_size, num_heads, qkv_bias, kernels)
        self.img_mlp = mlp(hidden_size, mlp_hidden_dim, kernels)
        self.txt_mod = Modulation(hidden_size, double=True, kernels=kernels)
        self.txt_attn = SelfAttention(hidden_size, num_heads, qkv_bias, kernels)
        self.txt_mlp = mlp(hidden_size, mlp_hidden_dim, kernels)
        self.attn = kernels.make_attention("double_block")

    def forward(self, img: Tensor, txt: Tensor, vec: Tensor, pe: Tensor) -> tuple[Tensor, Tensor]:
        img_mod1, img_mod2 = self.img_mod(vec)
        txt_mod1, txt_mod2 = self.txt_mod(vec)

        # prepare image and text for attention
        img_qk, img_v = self.img_attn.qk_v(modulate(img, img_mod1))
        txt_qk, txt_v = self.txt_attn.qk_v(modulate(txt, txt_mod1))

        # run actual attention over the joint sequence, text first
        qk = apply_rope(torch.cat((txt_qk, img_qk), dim=1), pe)
        attn = attend(self.attn, *heads_first(qk, torch.cat((txt_v, img_v), dim=1)), txt.shape[1])
        txt_attn, img_attn = attn[:, : txt.shape[1]], attn[:, txt.shape[1] :]

        # calculate the img and txt blocks
        img = torch.addcmul(img, img_mod1.gate, self.img_attn.proj(img_attn))
        img = torch.addcmul(img, img_mod2.gate, self.img_mlp(modulate(img, img_mod2)))
        txt = torch.addcmul(txt, txt_mod1.gate, self.txt_attn.proj(txt_attn))
        txt = torch.addcmul(txt, txt_mod2.gate, self.txt_mlp(modulate(txt, txt_mod2)))
        return img, txt


class SingleStreamBlock(nn.Module):
    """Parallel attention and MLP over the joint sequence; QKV and MLP-in are one fused projection."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float, kernels: KernelSet) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.mlp_hidden_dim = int(hidden_size * mlp_ratio)
        self.linear1 = kernels.make_linear(hidden_size, hidden_size * 3 + self.mlp_hidden_dim)
        self.linear2 = kernels.make_linear(hidden_size + self.mlp_hidden_dim, hidden_size)
        self.norm = QKNorm(hidden_size // num_heads)
        self.modulation = Modulation(hidden_size, double=False, kernels=kernels)
        self.attn = kernels.make_attention("single_block")

    def forward(self, x: Tensor, vec: Tensor, pe: Tensor, txt_len: int = 0) -> Tensor:
        mod, _ = self.modulation(vec)
        qkv, mlp_in = torch.split(self.linear1(modulate(x, mod)), [3 * self.hidden_size, self.mlp_hidden_dim], dim=-1)
        qk, v = split_qkv(qkv, self.num_heads, self.norm)
        attn = attend(self.attn, *heads_first(apply_rope(qk, pe), v), txt_len)
        output = self.linear2(torch.cat((attn, F.gelu(mlp_in, approximate="tanh")), dim=2))
        return torch.addcmul(x, mod.gate, output)


class LastLayer(nn.Module):
    def __init__(self, hidden_size: int, out_channels: int, kernels: KernelSet) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), kernels.make_linear(hidden_size, 2 * hidden_size,
                                                                            rowwise=True))
        self.linear = kernels.make_linear(hidden_size, out_channels)

    def forward(self, x: Tensor, vec: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(vec)[:, None, :].chunk(2, dim=-1)
        return self.linear(torch.addcmul(shift, layer_norm(x), 1 + scale))
