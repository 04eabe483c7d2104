"""Architecture configs of the hermetic Qwen-Image pipelines (``tiny-qwen-image``,
``tiny-qwen-image-edit``).

The real family's geometry at a fraction of the width: Qwen-Image's MMDiT (2x2 patches
over 16 latent channels, joint text-image attention, 3-axis RoPE), its Wan-style VAE (8x
spatial compression, 16 channels, the real latent normalisation), the real scheduler
config (dynamic exponential shift, terminal sigma 0.02), and a Qwen2.5-VL text encoder
(its vision tower too: the edit pipeline feeds it the input image) whose last hidden
state is the transformer's text input. Plain dicts for the diffusers / transformers
constructors (no torch).
"""

from __future__ import annotations

from typing import Any

# Qwen2.5-VL's hidden size = the transformer's joint_attention_dim (3584 in the real
# one)
QWEN_TEXT_HIDDEN = 64

# Qwen-Image's scheduler_config.json.
QWEN_IMAGE_SCHEDULER_CONFIG: dict[str, Any] = {
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 8192,
    "max_shift": 0.9,
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "shift_terminal": 0.02,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}

# AutoencoderKLQwenImage: Wan2.1's VAE layout (temporal downsampling declared, unused on
# single images); the latents' mean and std are the class defaults, the real
# checkpoint's values.
QWEN_IMAGE_VAE_CONFIG: dict[str, Any] = {
    "base_dim": 4,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 1,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}


def qwen_image_transformer(*, layers: int, heads: int, head_dim: int) -> dict[str, Any]:
    """QwenImageTransformer2DModel; the RoPE axes split the head as the real (16, 56,
    56) does 128."""
    assert head_dim == 32, "axes_dims_rope below splits a 32-wide head"
    return {
        "patch_size": 2,
        "in_channels": 64,  # 16 latent channels x a 2x2 patch, packed by the pipeline
        "out_channels": 16,
        "num_layers": layers,
        "attention_head_dim": head_dim,
        "num_attention_heads": heads,
        "joint_attention_dim": QWEN_TEXT_HIDDEN,
        "guidance_embeds": False,
        "axes_dims_rope": [8, 12, 12],
    }


def qwen2_5_vl_config() -> dict[str, Any]:
    """Qwen2.5-VL's text and vision configs (the special token ids are the tokenizer's,
    set by the builder)."""
    head_dim = QWEN_TEXT_HIDDEN // 4
    return {
        "text_config": {
            "hidden_size": QWEN_TEXT_HIDDEN,
            "intermediate_size": 2 * QWEN_TEXT_HIDDEN,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,  # grouped-query attention, as the real 28/4
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            # Multimodal RoPE: (temporal, height, width) sections of the head's rotary
            # half, as [16, 24, 24].
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1000000.0,
                "mrope_section": [2, 3, head_dim // 2 - 5],
            },
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": QWEN_TEXT_HIDDEN,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [1],
        },
    }
