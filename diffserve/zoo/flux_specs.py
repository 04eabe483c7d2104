"""Architecture configs of the hermetic FLUX.1-shaped models (``tiny-flux``,
``small-flux``).

Both keep FLUX.1's geometry (16 latent channels, VAE scale factor 8, 2x2 latent packing
into 64 transformer input channels, 3-axis RoPE) so every code path of a real FLUX
checkpoint is exercised; only widths and depths shrink. Plain dicts: they are passed
straight to the diffusers / transformers constructors and are cheap to import (no torch
here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diffserve.errors import ConfigError

# Text-encoder widths. Deliberately different, so a mix-up of joint_attention_dim (T5
# width) and pooled_projection_dim (CLIP width) fails loudly instead of happening to
# fit.
CLIP_HIDDEN = 32
T5_HIDDEN = 64

# FLUX.1's scheduler settings (resolution-dependent shift, "mu" interpolated between the
# two).
SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}

# FLUX.1's VAE: 16 latent channels, 4 resolution levels (scale factor 8), no quant
# convs, and the latent normalisation constants of the real autoencoder.
VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [32, 32, 32, 32],
    "layers_per_block": 1,
    "act_fn": "silu",
    "latent_channels": 16,
    "norm_num_groups": 32,
    "sample_size": 128,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "mid_block_add_attention": True,
}

_CLIP_CONFIG: dict[str, Any] = {
    "hidden_size": CLIP_HIDDEN,
    "intermediate_size": 2 * CLIP_HIDDEN,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 77,
    "projection_dim": CLIP_HIDDEN,
    "hidden_act": "quick_gelu",
}

# T5 v1.1 style (gated GELU), like FLUX's T5-XXL encoder.
T5_CONFIG: dict[str, Any] = {
    "d_model": T5_HIDDEN,
    "d_kv": 16,
    "d_ff": 2 * T5_HIDDEN,
    "num_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "is_encoder_decoder": False,
    "use_cache": False,
    "tie_word_embeddings": False,
}


def _transformer_config(
    *,
    layers: int,
    single_layers: int,
    heads: int,
    head_dim: int,
    axes: tuple[int, int, int],
) -> dict[str, Any]:
    assert sum(axes) == head_dim, "RoPE axes must cover the head dimension exactly"
    return {
        "patch_size": 1,
        "in_channels": 64,  # 16 latent channels x 2x2 packing
        "out_channels": None,
        "num_layers": layers,
        "num_single_layers": single_layers,
        "attention_head_dim": head_dim,
        "num_attention_heads": heads,
        "joint_attention_dim": T5_HIDDEN,
        "pooled_projection_dim": CLIP_HIDDEN,
        "axes_dims_rope": list(axes),
    }


@dataclass(frozen=True)
class FluxSpec:
    """Everything that defines one buildable model kind (guidance_embeds is chosen per
    build)."""

    name: str
    description: str
    transformer: dict[str, Any]
    vae: dict[str, Any] = field(default_factory=lambda: dict(VAE_CONFIG))
    clip: dict[str, Any] = field(default_factory=lambda: dict(_CLIP_CONFIG))
    t5: dict[str, Any] = field(default_factory=lambda: dict(T5_CONFIG))
    pipeline_class: str = "FluxPipeline"  # model_index.json's _class_name
    # Dev-derived models (Kontext) embed the guidance scale.
    always_guidance_embeds: bool = False

    def transformer_config(self, *, guidance_embeds: bool) -> dict[str, Any]:
        return {
            **self.transformer,
            "guidance_embeds": guidance_embeds or self.always_guidance_embeds,
        }


SPECS: dict[str, FluxSpec] = {
    "tiny-flux": FluxSpec(
        name="tiny-flux",
        description="~1M-parameter FLUX.1-shaped model for tests and demos "
        "(seconds to build)",
        transformer=_transformer_config(
            layers=2, single_layers=2, heads=4, head_dim=32, axes=(8, 12, 12)
        ),
    ),
    # FLUX.1 Kontext: the tiny transformer (dev-like, guidance embedded) served by
    # FluxKontextPipeline, which appends the reference image's latents to the sequence.
    "tiny-flux-kontext": FluxSpec(
        name="tiny-flux-kontext",
        description="tiny-flux as FLUX.1 Kontext (FluxKontextPipeline: "
        "image editing from a reference image)",
        transformer=_transformer_config(
            layers=2, single_layers=2, heads=4, head_dim=32, axes=(8, 12, 12)
        ),
        pipeline_class="FluxKontextPipeline",
        always_guidance_embeds=True,
    ),
    # Hidden 768 (12 heads x 64); 4 double + 8 single blocks keeps FLUX.1's 1:2 ratio,
    # ~150M params.
    "small-flux": FluxSpec(
        name="small-flux",
        description="~150M-parameter FLUX.1-shaped transformer for benchmarks",
        transformer=_transformer_config(
            layers=4, single_layers=8, heads=12, head_dim=64, axes=(16, 24, 24)
        ),
    ),
}


def get_spec(kind: str) -> FluxSpec:
    """Look up a model kind; unknown names raise a ConfigError that lists the known
    ones."""
    try:
        return SPECS[kind]
    except KeyError:
        raise ConfigError(
            f"unknown model {kind!r}",
            path="model",
            hint=f"choose one of: {', '.join(SPECS)}",
        ) from None
