"""The shape of a Wan transformer, read from its diffusers ``config.json``
(``WanTransformer3DModel``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffserve.errors import ModelLoadError


@dataclass(frozen=True)
class WanParams:
    # (frames, height, width) of one token, in latent pixels.
    patch_size: tuple[int, int, int]
    num_heads: int
    head_dim: int
    # 16 latent channels; 36 for Wan2.2 image-to-video (noise + frame mask + first
    # frame)
    in_channels: int
    out_channels: int
    text_dim: int  # the UMT5 hidden size
    freq_dim: int  # sinusoidal timestep channels
    ffn_dim: int
    num_layers: int
    cross_attn_norm: bool
    eps: float
    rope_max_seq_len: int

    @property
    def dim(self) -> int:
        return self.num_heads * self.head_dim

    @classmethod
    def from_diffusers_config(
        cls, config: dict[str, Any], source: str = ""
    ) -> WanParams:
        # Wan2.1's image-to-video (a CLIP image encoder feeding extra cross-attention
        # keys) and Wan2.2's TI2V-5B (per-token timesteps) are other layouts: refused by
        # name rather than loaded wrong.
        for key in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
            if config.get(key) is not None:
                raise ModelLoadError(
                    f"{source}: a Wan transformer with {key}={config[key]} "
                    "(Wan2.1 image-to-video's "
                    "CLIP image branch) is not supported; Wan2.1/2.2 text-to-video "
                    "and Wan2.2 "
                    "image-to-video are"
                )
        if config.get("qk_norm", "rms_norm_across_heads") != "rms_norm_across_heads":
            raise ModelLoadError(
                f"{source}: qk_norm={config.get('qk_norm')!r} is not supported "
                "(Wan uses rms_norm_across_heads)"
            )
        try:
            patch = tuple(int(p) for p in config.get("patch_size", (1, 2, 2)))
            in_channels = int(config.get("in_channels", 16))
            return cls(
                patch_size=(patch[0], patch[1], patch[2]),
                num_heads=int(config["num_attention_heads"]),
                head_dim=int(config["attention_head_dim"]),
                in_channels=in_channels,
                out_channels=int(config.get("out_channels") or in_channels),
                text_dim=int(config["text_dim"]),
                freq_dim=int(config.get("freq_dim", 256)),
                ffn_dim=int(config["ffn_dim"]),
                num_layers=int(config["num_layers"]),
                cross_attn_norm=bool(config.get("cross_attn_norm", True)),
                eps=float(config.get("eps", 1e-6)),
                rope_max_seq_len=int(config.get("rope_max_seq_len", 1024)),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ModelLoadError(
                f"{source}: not a Wan transformer config ({type(exc).__name__}: {exc})"
            ) from None
