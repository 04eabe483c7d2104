"""FLUX building blocks: modulation, QK-norm attention projections, double- and single-stream blocks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diffserve.layers.kernels import KernelSet
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
        self.lin = kernels.make_linear(dim, self.multiplier * dim)

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

    def qkv_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``[B, L, dim]`` -> normed q, k and v, each ``[B, H, L, D]``."""
        return split_heads(self.qkv(x), self.num_heads, self.norm)


def split_heads(qkv: Tensor, num_heads: int, norm: QKNorm) -> tuple[Tensor, Tensor, Tensor]:
    # "B L (K H D) -> K B H L D" as a view; the norms produce the new q/k tensors anyway.
    q, k, v = qkv.unflatten(-1, (3, num_heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)
    return norm.query_norm(q), norm.key_norm(k), v


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
        img_q, img_k, img_v = self.img_attn.qkv_heads((1 + img_mod1.scale) * layer_norm(img) + img_mod1.shift)
        txt_q, txt_k, txt_v = self.txt_attn.qkv_heads((1 + txt_mod1.scale) * layer_norm(txt) + txt_mod1.shift)

        # run actual attention over the joint sequence, text first
        q = apply_rope(torch.cat((txt_q, img_q), dim=2), pe)
        k = apply_rope(torch.cat((txt_k, img_k), dim=2), pe)
        attn = self.attn(q, k, torch.cat((txt_v, img_v), dim=2))
        txt_attn, img_attn = attn[:, : txt.shape[1]], attn[:, txt.shape[1] :]

        # calculate the img and txt blocks
        img = img + img_mod1.gate * self.img_attn.proj(img_attn)
        img = img + img_mod2.gate * self.img_mlp((1 + img_mod2.scale) * layer_norm(img) + img_mod2.shift)
        txt = txt + txt_mod1.gate * self.txt_attn.proj(txt_attn)
        txt = txt + txt_mod2.gate * self.txt_mlp((1 + txt_mod2.scale) * layer_norm(txt) + txt_mod2.shift)
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

    def forward(self, x: Tensor, vec: Tensor, pe: Tensor) -> Tensor:
        mod, _ = self.modulation(vec)
        x_mod = (1 + mod.scale) * layer_norm(x) + mod.shift
        qkv, mlp_in = torch.split(self.linear1(x_mod), [3 * self.hidden_size, self.mlp_hidden_dim], dim=-1)
        q, k, v = split_heads(qkv, self.num_heads, self.norm)
        attn = self.attn(apply_rope(q, pe), apply_rope(k, pe), v)
        output = self.linear2(torch.cat((attn, F.gelu(mlp_in, approximate="tanh")), dim=2))
        return x + mod.gate * output


class LastLayer(nn.Module):
    def __init__(self, hidden_size: int, out_channels: int, kernels: KernelSet) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), kernels.make_linear(hidden_size, 2 * hidden_size))
        self.linear = kernels.make_linear(hidden_size, out_channels)

    def forward(self, x: Tensor, vec: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)
        return self.linear((1 + scale[:, None, :]) * layer_norm(x) + shift[:, None, :])
