"""The component configs of the tiny generic models (``generic_specs.py``): CLIP and T5
text encoders, SD3's and PixArt-Sigma's transformers, PixArt-Sigma's VAE and
scheduler."""

from __future__ import annotations

from typing import Any

from diffserve.zoo.flux_specs import T5_CONFIG, VAE_CONFIG

# Three deliberately different text widths, so that mix-ups fail loudly instead of
# happening to fit: the pipeline concatenates the two CLIP hidden states (32 + 48 = 80,
# zero-padded up to the T5 width) and the two CLIP projections (pooled_projection_dim =
# 80); joint_attention_dim is the T5 width (96).
SD3_CLIP_L_HIDDEN = 32
SD3_CLIP_G_HIDDEN = 48
SD3_T5_HIDDEN = 96
PIXART_T5_HIDDEN = 64


def clip(hidden: int, *, act: str) -> dict[str, Any]:
    return {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 77,
        # SD3's CLIP-L and CLIP-G project to their own width (768, 1280)
        "projection_dim": hidden,
        "hidden_act": act,
    }


def t5(hidden: int) -> dict[str, Any]:
    """T5 v1.1 (gated GELU) like FLUX's tiny T5, at another width."""
    return {**T5_CONFIG, "d_model": hidden, "d_ff": 2 * hidden}


def sd3_transformer(
    *, sample_size: int, layers: int, heads: int, head_dim: int
) -> dict[str, Any]:
    return {
        "sample_size": sample_size,  # the pipeline's default latent size (image = 8x)
        "patch_size": 2,
        "in_channels": 16,
        "out_channels": 16,
        "num_layers": layers,
        "attention_head_dim": head_dim,
        "num_attention_heads": heads,
        "joint_attention_dim": SD3_T5_HIDDEN,
        # The context stream runs at the transformer width, so the caption projection
        # must match it.
        "caption_projection_dim": heads * head_dim,
        "pooled_projection_dim": SD3_CLIP_L_HIDDEN + SD3_CLIP_G_HIDDEN,
        # The sin-cos table is cropped to the image: latent side / patch <= 96, i.e.
        # images up to 1536 px.
        "pos_embed_max_size": 96,
        # SD3.0 style (SD3.5-medium lists MMDiT-X layers here)
        "dual_attention_layers": [],
        "qk_norm": None,
    }


# PixArt-Sigma's scheduler_config.json (DPM-Solver++ 2M over PixArt's linear-beta
# epsilon schedule).
PIXART_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.0001,
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "prediction_type": "epsilon",
    "algorithm_type": "dpmsolver++",
    "solver_order": 2,
    "solver_type": "midpoint",
    "lower_order_final": True,
    "thresholding": False,
    "timestep_spacing": "linspace",
    "steps_offset": 0,
    "use_karras_sigmas": False,
    "euler_at_final": False,
}


# PixArt-Sigma ships SDXL's VAE: 4 latent channels, quant convs, scaling 0.13025, no
# shift.
PIXARTVAE_CONFIG: dict[str, Any] = {
    **VAE_CONFIG,
    "latent_channels": 4,
    "scaling_factor": 0.13025,
    "shift_factor": None,
    "use_quant_conv": True,
    "use_post_quant_conv": True,
    "force_upcast": True,
}


def pixart_transformer(*, layers: int, heads: int, head_dim: int) -> dict[str, Any]:
    return {
        # sample_size 32 is PixArt-Sigma-256's: the pipeline's resolution binning
        # supports 32/64/128/256 only, and PixArt scales the sin-cos grid by image size
        # / 512 (interpolation_scale 0.5).
        "sample_size": 32,
        "interpolation_scale": 0.5,
        "patch_size": 2,
        "in_channels": 4,
        "out_channels": 8,  # learned sigma: the pipeline keeps the first half (epsilon)
        "num_layers": layers,
        "num_attention_heads": heads,
        "attention_head_dim": head_dim,
        "cross_attention_dim": heads
        * head_dim,  # text is projected to the transformer width first
        "caption_channels": PIXART_T5_HIDDEN,
        "norm_type": "ada_norm_single",
        "num_embeds_ada_norm": 1000,
        "norm_elementwise_affine": False,
        "norm_eps": 1e-6,
        "activation_fn": "gelu-approximate",
        "attention_bias": True,
        "attention_type": "default",
        "dropout": 0.0,
        "upcast_attention": False,
        # Sigma never uses PixArt-alpha's size/aspect conditions
        "use_additional_conditions": False,
    }
