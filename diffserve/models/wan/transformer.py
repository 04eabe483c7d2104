"""The native Wan transformer (diffusers' ``WanTransformer3DModel`` layout and names): a
3D patch embedding, timestep and text embedders, ``num_layers`` blocks, a modulated
output projection back to latent patches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from diffserve.layers.collectives import all_gather_into
from diffserve.layers.kernels import KernelSet
from diffserve.layers.per_sample import each_sample
from diffserve.layers.ulysses import UlyssesAttention
from diffserve.logging import get_logger
from diffserve.models.loader import load_strict, read_config, read_safetensors
from diffserve.models.wan.blocks import LayerNorm32, WanBlock
from diffserve.models.wan.embeddings import RotaryTable, timestep_features
from diffserve.models.wan.params import WanParams

logger = get_logger(__name__)

# What diffusers keeps in float32 when it loads a Wan transformer in half precision (its
# ``_keep_in_fp32_modules``, matched against every part of a parameter's name): the
# timestep MLP, the modulation tables and the affine norms.
FLOAT32_MODULES = frozenset(
    {"time_embedder", "scale_shift_table", "norm1", "norm2", "norm3"}
)


def kept_in_float32(key: str) -> bool:
    return not FLOAT32_MODULES.isdisjoint(key.split("."))


class TimeEmbedder(nn.Module):
    def __init__(self, freq_dim: int, dim: int, kernels: KernelSet) -> None:
        super().__init__()
        self.linear_1 = kernels.make_linear(freq_dim, dim)
        self.linear_2 = kernels.make_linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(nn.functional.silu(self.linear_1(x)))


class TextProjection(nn.Module):
    def __init__(self, text_dim: int, dim: int, kernels: KernelSet) -> None:
        super().__init__()
        self.linear_1 = kernels.make_linear(text_dim, dim, activation="gelu_tanh")
        self.linear_2 = kernels.make_linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(self.linear_1(x))


class ConditionEmbedder(nn.Module):
    def __init__(self, params: WanParams, kernels: KernelSet) -> None:
        super().__init__()
        self.freq_dim = params.freq_dim
        self.time_embedder = TimeEmbedder(params.freq_dim, params.dim, kernels)
        self.time_proj = kernels.make_linear(params.dim, params.dim * 6)
        self.text_embedder = TextProjection(params.text_dim, params.dim, kernels)

    def forward(self, timesteps: Tensor, text: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(temb [B, dim], modulation [B, 6, dim], context [B, L_text, dim])``."""
        features = timestep_features(timesteps, self.freq_dim)
        weight = self.time_embedder.linear_1.weight
        temb = self.time_embedder(features.to(weight.dtype)).type_as(text)
        modulation = self.time_proj(nn.functional.silu(temb)).unflatten(1, (6, -1))
        return temb, modulation, self.text_embedder(text)


class WanTransformer(nn.Module):
    """Flow-matching video transformer: ``forward(latents [B, C, F, H, W], timesteps
    [B], text [B, L, text_dim])`` returns the velocity ``[B, out_channels, F, H,
    W]``."""

    def __init__(self, params: WanParams, kernels: KernelSet) -> None:
        super().__init__()
        self.params = params
        self.kernels = kernels
        self.counters = kernels.counters
        dim = params.dim
        self.patch_embedding = nn.Conv3d(
            params.in_channels,
            dim,
            kernel_size=params.patch_size,
            stride=params.patch_size,
        )
        self.condition_embedder = ConditionEmbedder(params, kernels)
        self.blocks = nn.ModuleList(
            WanBlock(
                dim,
                params.ffn_dim,
                params.num_heads,
                params.cross_attn_norm,
                params.eps,
                kernels,
            )
            for _ in range(params.num_layers)
        )
        self.norm_out = LayerNorm32(dim, params.eps, affine=False)
        self.proj_out = kernels.make_linear(
            dim,
            params.out_channels
            * params.patch_size[0]
            * params.patch_size[1]
            * params.patch_size[2],
        )
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        self.rotary = RotaryTable(params.head_dim, params.rope_max_seq_len)
        # (group, rank, degree): set by shard_sequence.
        self.ulysses: tuple[Any, int, int] | None = None

    def token_grid(self, latents: Tensor) -> tuple[int, int, int]:
        p_t, p_h, p_w = self.params.patch_size
        _, _, frames, height, width = latents.shape
        return frames // p_t, height // p_h, width // p_w

    def rope(self, latents: Tensor) -> tuple[Tensor, Tensor]:
        """The rotary tables of ``latents``' token grid (the same for every step of a
        request: compute once); under Ulysses, this rank's rows."""
        cos, sin = self.rotary.table(*self.token_grid(latents), device=latents.device)
        if self.ulysses is not None:
            _, rank, degree = self.ulysses
            cos, sin = (
                cos.chunk(degree, dim=1)[rank].contiguous(),
                sin.chunk(degree, dim=1)[rank].contiguous(),
            )
        return cos, sin

    def shard_sequence(self, group: Any, rank: int, degree: int) -> None:
        """Ulysses sequence parallelism over ``group``: from now on every rank runs the
        blocks on its contiguous ``1/degree`` of the video tokens, self-attention
        exchanging heads for tokens (``layers/ulysses.py``), and the output tokens are
        gathered before the unpatchify, so ``forward`` keeps its full-video contract."""
        if self.params.num_heads % degree:
            raise ValueError(
                f"ulysses degree {degree} must divide the {self.params.num_heads} "
                "attention heads"
            )
        for block in self.blocks:
            assert isinstance(block, WanBlock)
            attention = block.attn1
            attention.attn = UlyssesAttention(
                attention.attn, group, self.counters.collectives
            )
        self.ulysses = (group, rank, degree)

    def forward(
        self,
        latents: Tensor,
        timesteps: Tensor,
        text: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        self.counters.count_forward()
        rope = rope if rope is not None else self.rope(latents)
        x, temb, modulation, context = self.embed(latents, timesteps, text)
        return self.head(
            self.run_blocks(x, context, modulation, rope),
            temb,
            self.token_grid(latents),
        )

    # The pieces of ``forward``, in its order: the step cache (models/wan/step_cache.py)
    # runs them apart and must stay bit-identical to the fused call when it computes
    # every block.
    def embed(
        self, latents: Tensor, timesteps: Tensor, text: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(tokens [B, L, dim] (this rank's under Ulysses), temb, modulation [B, 6,
        dim], context)``."""
        x = self.patchify(latents).flatten(2).transpose(1, 2)
        if self.ulysses is not None:
            _, rank, degree = self.ulysses
            if x.shape[1] % degree:
                raise ValueError(
                    f"{x.shape[1]} video tokens do not split over ulysses "
                    f"degree {degree}"
                )
            x = x.chunk(degree, dim=1)[rank]
        temb, modulation, context = self.condition_embedder(timesteps, text)
        return x.contiguous(), temb, modulation, context

    def patchify(self, latents: Tensor) -> Tensor:
        """The patch embedding ``[B, dim, F', H', W']``. Like the kernel set's Linear
        and Attention, one convolution per video when ``batch_invariant``: oneDNN (and
        cuDNN) pick a convolution algorithm by batch size, and another one sums in
        another order, so a video's tokens would change in their last bits with the
        batch it runs in."""
        if self.kernels.batch_invariant and latents.shape[0] > 1:
            return each_sample(self.patch_embedding, latents)
        return self.patch_embedding(latents)

    def run_blocks(
        self,
        x: Tensor,
        context: Tensor,
        modulation: Tensor,
        rope: tuple[Tensor, Tensor],
        start: int = 0,
    ) -> Tensor:
        """Blocks ``start`` .. last (First-Block Cache runs block 0 alone first)."""
        for block in self.blocks[start:]:
            x = block(x, context, modulation, rope)
        return x

    def head(self, x: Tensor, temb: Tensor, grid: tuple[int, int, int]) -> Tensor:
        """The modulated output projection (under Ulysses: every rank's tokens gathered,
        in rank order, which is token order), unpatchified to ``[B, C, F, H, W]``."""
        shift, scale = (self.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        x = self.proj_out((self.norm_out(x) * (1 + scale) + shift).type_as(x))
        if self.ulysses is not None:
            group = self.ulysses[0]
            x = torch.cat(
                all_gather_into(x, group, self.counters.collectives).unbind(0), dim=1
            )
        p_t, p_h, p_w = self.params.patch_size
        frames, height, width = grid
        x = x.reshape(x.shape[0], frames, height, width, p_t, p_h, p_w, -1).permute(
            0, 7, 1, 4, 2, 5, 3, 6
        )
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)


def load_wan_transformer(
    transformer_dir: str | Path,
    kernels: KernelSet,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> WanTransformer:
    """Build the native transformer of a diffusers-format ``transformer/`` directory on
    ``kernels`` and load its weights strictly (every key, every shape); the float32
    parameters diffusers keeps stay float32."""
    source = str(transformer_dir)
    params = WanParams.from_diffusers_config(read_config(transformer_dir), source)
    state_dict = read_safetensors(transformer_dir)
    # Diffusers ignores it too.
    state_dict = {k: v for k, v in state_dict.items() if ".norm_added_q." not in k}
    with torch.device("meta"):
        model = WanTransformer(params, kernels)
    load_strict(
        model,
        state_dict,
        dtype=dtype,
        device=device,
        source=source,
        keep_float32=kept_in_float32,
    )
    logger.info(
        "loaded Wan transformer from %s (%d blocks, %d heads of %d) with kernels %s",
        source,
        params.num_layers,
        params.num_heads,
        params.head_dim,
        kernels.describe(),
    )
    return model.eval().requires_grad_(False)
