"""Architecture configs of the hermetic FLUX.2 pipelines: FLUX.2-klein
(``Flux2KleinPipeline``, a Qwen3 text encoder) and FLUX.2-dev (``Flux2Pipeline``, a
Mistral3 text encoder read through a Pixtral processor's chat template).

Both: FLUX.2's MMDiT (double then single blocks, 4-axis RoPE, shared modulation), its
32-channel VAE with 2x2 latent patches and batch-norm statistics, and three hidden
states of the language model stacked as the text input (klein: layers 9, 18, 27; dev:
10, 20, 30), so the tiny encoders keep that depth at a small width. dev's transformer
embeds the guidance scale (guidance-distilled, one forward a step); klein runs real CFG.
Plain dicts (no torch).
"""

from __future__ import annotations

from typing import Any

from diffserve.zoo.flux_specs import VAE_CONFIG
from diffserve.zoo.z_image_specs import QWEN3_HIDDEN

KLEIN_TEXT_LAYERS = (9, 18, 27)  # Flux2KleinPipeline's text_encoder_out_layers
DEV_TEXT_LAYERS = (10, 20, 30)  # Flux2Pipeline's
MISTRAL_HIDDEN = 64

# FLUX.2's scheduler_config.json: resolution-dependent shift (the pipeline computes its
# own empirical mu).
FLUX2_SCHEDULER_CONFIG: dict[str, Any] = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
}
# AutoencoderKLFlux2: 32 latent channels, normalised per 2x2 patch by batch-norm
# statistics (128 channels).
FLUX2_VAE_CONFIG: dict[str, Any] = {
    **{
        k: v
        for k, v in VAE_CONFIG.items()
        if k not in ("scaling_factor", "shift_factor")
    },
    "latent_channels": 32,
    "use_quant_conv": True,
    "use_post_quant_conv": True,
    "patch_size": [2, 2],
}

# Mistral's chat template as Flux2Pipeline uses it: a system turn and a user turn, each
# a list of text parts.
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}{%- set "
    "text = message['content'] if message['content'] is "
    "string "
    "else message['content'] | map(attribute='text') | "
    "join('') %}{%- if message['role'] == 'system' %}"
    "{{ '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}{%- "
    "elif message['role'] == 'user' %}"
    "{{ '[INST]' + text + '[/INST]' }}{%- else %}{{ text "
    "+ eos_token }}{%- endif %}{%- endfor %}"
)
MISTRAL_SPECIAL_TOKENS = (
    "[INST]",
    "[/INST]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[IMG]",
    "[IMG_BREAK]",
    "[IMG_END]",
)


def flux2_transformer(
    *,
    double: int,
    single: int,
    heads: int,
    head_dim: int,
    text_width: int,
    guidance_embeds: bool,
) -> dict[str, Any]:
    """Flux2Transformer2DModel; 4 RoPE axes as the real (32, 32, 32, 32)."""
    assert head_dim == 32, "axes_dims_rope below splits a 32-wide head"
    return {
        "patch_size": 1,
        "in_channels": 128,  # 32 latent channels x a 2x2 patch, packed by the pipeline
        "num_layers": double,
        "num_single_layers": single,
        "attention_head_dim": head_dim,
        "num_attention_heads": heads,
        "joint_attention_dim": text_width,
        "timestep_guidance_channels": 256,
        "mlp_ratio": 3.0,
        "axes_dims_rope": [8, 8, 8, 8],
        "rope_theta": 2000,
        "eps": 1e-6,
        "guidance_embeds": guidance_embeds,
    }


def klein_transformer() -> dict[str, Any]:
    return flux2_transformer(
        double=1,
        single=2,
        heads=4,
        head_dim=32,
        text_width=len(KLEIN_TEXT_LAYERS) * QWEN3_HIDDEN,
        guidance_embeds=False,
    )


def dev_transformer() -> dict[str, Any]:
    return flux2_transformer(
        double=1,
        single=2,
        heads=4,
        head_dim=32,
        text_width=len(DEV_TEXT_LAYERS) * MISTRAL_HIDDEN,
        guidance_embeds=True,
    )


def mistral3_config() -> dict[str, Any]:
    """Mistral3 (Mistral-Small-3's text model, a Pixtral vision tower): 31 layers so
    hidden state 30 exists."""
    return {
        "text_config": {
            "model_type": "mistral",
            "hidden_size": MISTRAL_HIDDEN,
            "intermediate_size": 2 * MISTRAL_HIDDEN,
            "num_hidden_layers": DEV_TEXT_LAYERS[-1],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": MISTRAL_HIDDEN // 4,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000000.0},
        },
        "vision_config": {
            "model_type": "pixtral",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "head_dim": 16,
            "patch_size": 14,
            "image_size": 1540,
        },
        "spatial_merge_size": 2,
        "multimodal_projector_bias": False,
    }
