"""``FluxParams``: the architecture of one FLUX transformer, read from a diffusers
``config.json``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diffserve.errors import ModelLoadError


@dataclass(frozen=True)
class FluxParams:
    in_channels: int
    out_channels: int
    vec_in_dim: int  # pooled CLIP width (diffusers: pooled_projection_dim)
    context_in_dim: int  # T5 width (diffusers: joint_attention_dim)
    hidden_size: int
    mlp_ratio: float
    num_heads: int
    depth: int
    depth_single_blocks: int
    axes_dim: tuple[int, ...]
    theta: int
    qkv_bias: bool
    guidance_embed: bool

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ModelLoadError(
                f"hidden size {self.hidden_size} is not divisible by "
                f"num_heads {self.num_heads}"
            )
        if sum(self.axes_dim) != self.head_dim:
            raise ModelLoadError(
                f"RoPE axes_dim {self.axes_dim} sum to {sum(self.axes_dim)}, "
                f"but the head dim is {self.head_dim}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @classmethod
    def from_diffusers_config(cls, config: Mapping[str, Any]) -> FluxParams:
        """Map a ``FluxTransformer2DModel`` config to params (diffusers' FLUX is always
        mlp_ratio 4)."""
        if config.get("patch_size", 1) != 1:
            raise ModelLoadError(
                f"patch_size={config['patch_size']} is not supported (FLUX uses 1)"
            )
        heads = int(config.get("num_attention_heads", 24))
        head_dim = int(config.get("attention_head_dim", 128))
        in_channels = int(config.get("in_channels", 64))
        return cls(
            in_channels=in_channels,
            out_channels=int(config.get("out_channels") or in_channels),
            vec_in_dim=int(config.get("pooled_projection_dim", 768)),
            context_in_dim=int(config.get("joint_attention_dim", 4096)),
            hidden_size=heads * head_dim,
            mlp_ratio=4.0,
            num_heads=heads,
            depth=int(config.get("num_layers", 19)),
            depth_single_blocks=int(config.get("num_single_layers", 38)),
            axes_dim=tuple(int(a) for a in config.get("axes_dims_rope", (16, 56, 56))),
            theta=10_000,
            qkv_bias=True,
            guidance_embed=bool(config.get("guidance_embeds", False)),
        )
