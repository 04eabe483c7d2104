"""Architecture configs of the hermetic Wan pipelines: Wan2.1 text-to-video, Wan2.2's
two-expert MoE and its image-to-video, and a benchmark size.

Each keeps Wan's geometry (16 latent channels, a VAE with 8x spatial and 4x temporal
compression, 1x2x2 patches, a UMT5 text encoder, the flow-matching UniPC scheduler with
a flow shift, Wan2.2's ``boundary_ratio``) so every path of a real checkpoint runs; only
widths and depths shrink. Plain dicts, cheap to import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diffserve.errors import ConfigError
from diffserve.zoo.flux_specs import T5_CONFIG

UMT5_HIDDEN = 32

# Wan2.1's scheduler_config.json: UniPC over flow-matching sigmas, shifted (3.0 at 480p,
# 5.0 at 720p).
SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 3.0,
}

# The Wan VAE's layout at a tenth of the width: causal 3D convolutions, 8x spatial
# (three downsamples) and 4x temporal (the last two) compression, 16 latent channels
# with Wan's per-channel mean and std.
VAE_CONFIG: dict[str, Any] = {
    "base_dim": 8,
    "z_dim": 16,
    "dim_mult": [1, 1, 1, 1],
    "num_res_blocks": 1,
    "temperal_downsample": [False, True, True],
}


def transformer_config(
    *, layers: int, heads: int, head_dim: int, ffn: int, in_channels: int = 16
) -> dict[str, Any]:
    return {
        "patch_size": [1, 2, 2],
        "num_attention_heads": heads,
        "attention_head_dim": head_dim,
        "in_channels": in_channels,
        "out_channels": 16,
        "text_dim": UMT5_HIDDEN,
        "freq_dim": 256,
        "ffn_dim": ffn,
        "num_layers": layers,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "rope_max_seq_len": 1024,
    }


@dataclass(frozen=True)
class WanSpec:
    name: str
    description: str
    pipeline: str  # WanPipeline or WanImageToVideoPipeline
    transformer: dict[str, Any]
    # 2: Wan2.2's high-noise ``transformer`` and low-noise ``transformer_2``.
    experts: int = 1
    boundary_ratio: float | None = None
    vae: dict[str, Any] = field(default_factory=lambda: dict(VAE_CONFIG))
    scheduler: dict[str, Any] = field(default_factory=lambda: dict(SCHEDULER_CONFIG))
    text_encoder: dict[str, Any] = field(
        default_factory=lambda: {
            **T5_CONFIG,
            "d_model": UMT5_HIDDEN,
            "d_ff": 2 * UMT5_HIDDEN,
        }
    )
    request_defaults: dict[str, Any] = field(default_factory=dict)

    def model_index(self) -> dict[str, Any]:
        index: dict[str, Any] = {
            "_class_name": self.pipeline,
            "boundary_ratio": self.boundary_ratio,
            "expand_timesteps": False,
            "scheduler": ["diffusers", "UniPCMultistepScheduler"],
            "text_encoder": ["transformers", "UMT5EncoderModel"],
            "tokenizer": ["transformers", "T5TokenizerFast"],
            "transformer": ["diffusers", "WanTransformer3DModel"],
            "transformer_2": ["diffusers", "WanTransformer3DModel"]
            if self.experts == 2
            else [None, None],
            "vae": ["diffusers", "AutoencoderKLWan"],
        }
        # Wan2.2's: no CLIP image encoder.
        if self.pipeline == "WanImageToVideoPipeline":
            index.update(image_encoder=[None, None], image_processor=[None, None])
        return index


WAN_SPECS: dict[str, WanSpec] = {
    spec.name: spec
    for spec in (
        WanSpec(
            "tiny-wan",
            "Wan2.1-shaped text-to-video model for tests (seconds to build)",
            "WanPipeline",
            transformer_config(layers=2, heads=2, head_dim=32, ffn=64),
        ),
        WanSpec(
            "tiny-wan22",
            "Wan2.2-shaped two-expert (MoE) text-to-video model for tests",
            "WanPipeline",
            transformer_config(layers=2, heads=2, head_dim=32, ffn=64),
            experts=2,
            boundary_ratio=0.875,
        ),
        WanSpec(
            "tiny-wan22-i2v",
            "Wan2.2-shaped two-expert image-to-video model for tests",
            "WanImageToVideoPipeline",
            transformer_config(layers=2, heads=2, head_dim=32, ffn=64, in_channels=36),
            experts=2,
            boundary_ratio=0.9,
        ),
        # Hidden 768 (12 heads x 64), 8 blocks: ~90M transformer parameters.
        WanSpec(
            "small-wan",
            "Wan2.1-shaped ~90M-parameter text-to-video transformer for benchmarks",
            "WanPipeline",
            transformer_config(layers=8, heads=12, head_dim=64, ffn=2048),
        ),
    )
}


def get_wan_spec(kind: str) -> WanSpec:
    try:
        return WAN_SPECS[kind]
    except KeyError:
        raise ConfigError(
            f"unknown model {kind!r}",
            path="model",
            hint=f"choose one of: {', '.join(WAN_SPECS)}",
        ) from None
