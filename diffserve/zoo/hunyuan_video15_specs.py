"""Architecture configs of the hermetic HunyuanVideo-1.5 pipeline
(``tiny-hunyuan-video-15``).

The real family's geometry at a fraction of the width, so every code path of a real
480p text-to-video checkpoint (``HunyuanVideo15Pipeline``) runs: a dual-stream MMDiT
over 32 latent channels (65 input channels: latents, the i2v condition latents and
their mask, all zeros for t2v), 1x1x1 patches, 3-axis RoPE with theta 256, a token
refiner on the Qwen2.5-VL hidden states, a ByT5 glyph-text projection, a SigLIP-width
image projection (fed zeros for t2v), a causal 3D VAE with 16x spatial and 4x temporal
compression, the flow-matching Euler scheduler with a fixed shift of 5, and a
classifier-free-guidance ``guider`` component (the pipeline has no ``guidance_scale``
argument). Plain dicts for the diffusers / transformers constructors (no torch).
"""

from __future__ import annotations

from typing import Any

KIND = "tiny-hunyuan-video-15"
DESCRIPTION = (
    "~9M-parameter HunyuanVideo-1.5-shaped text-to-video model (Qwen2.5-VL and "
    "ByT5 text encoders) for tests"
)
PIPELINE = "HunyuanVideo15Pipeline"

# Text-encoder widths (the transformer's text_embed_dim / text_embed_2_dim: 3584 and
# 1472 in the real Qwen2.5-VL-7B and ByT5-small), deliberately different from each
# other and from the DiT width so that a mix-up fails loudly.
QWEN_TEXT_HIDDEN = 64
BYT5_HIDDEN = 32
# SigLIP's width is 1152 in the real model; the t2v pipeline feeds 729 zero tokens.
IMAGE_EMBED_DIM = 32
LATENT_CHANNELS = 32  # the real VAE's

# The Qwen2.5-VL-7B chat template (as its tokenizer ships it): the pipeline renders its
# system message through ``apply_chat_template`` and crops the first 108 tokens.
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = "
    "namespace(value=0) %}{% for message in messages %}{% if loop.first and "
    "message['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == "
    "'image' or 'image' in content or 'image_url' in content %}{% set "
    "image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|>"
    "<|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|>"
    "<|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt "
    "%}<|im_start|>assistant\n{% endif %}"
)
# HunyuanVideo15Pipeline's system message, verbatim (its source continues the string
# over lines with a backslash, so each numbered aspect follows a run of nine spaces).
# The tiny Qwen tokenizer learns its words, and Qwen's whitespace splitting of those
# runs (eight spaces, then one), so that the system turn tokenizes as the real one does.
SYSTEM_MESSAGE = (" " * 9).join(
    (
        "You are a helpful assistant. Describe the video by detailing the following "
        "aspects:",
        "1. The main content and theme of the video.",
        "2. The color, shape, size, texture, quantity, text, and spatial relationships "
        "of the objects.",
        "3. Actions, events, behaviors temporal relationships, physical movement "
        "changes of the objects.",
        "4. background environment, light, style and atmosphere.",
        "5. camera angles, movements, and transitions used in the video.",
    )
)
# HunyuanVideo15Pipeline's ``prompt_template_encode_start_idx``: the real tokenizer's
# length of the system turn plus ``<|im_start|>user\n``, which the pipeline crops off
# the hidden states; the tiny tokenizer gives the same count (the tests check), so the
# cropped embeddings start at the user's prompt, as the real model's do.
TEMPLATE_CROP_START = 108

# HunyuanVideo15Transformer3DModel. The real 480p checkpoint: 16 heads x 128 (2048
# wide), 54 dual-stream blocks, rope_axes_dim (16, 56, 56) splitting the 128-wide head;
# here 2 heads x 32 with the same 1:3.5:3.5 split, 2 blocks.
TRANSFORMER_CONFIG: dict[str, Any] = {
    "in_channels": 2 * LATENT_CHANNELS + 1,  # latents + condition latents + mask: 65
    "out_channels": LATENT_CHANNELS,
    "num_attention_heads": 2,
    "attention_head_dim": 32,
    "num_layers": 2,
    "num_refiner_layers": 2,  # the real token refiner's depth
    "mlp_ratio": 4.0,  # real
    "patch_size": 1,  # real: 1x1 spatial ...
    "patch_size_t": 1,  # ... and 1 temporal
    "qk_norm": "rms_norm",  # real
    "text_embed_dim": QWEN_TEXT_HIDDEN,
    "text_embed_2_dim": BYT5_HIDDEN,
    "image_embed_dim": IMAGE_EMBED_DIM,
    "rope_theta": 256.0,  # real
    "rope_axes_dim": [4, 14, 14],  # sums to the head width, as (16, 56, 56) to 128
    # The 480p checkpoints' pixel target (the default size buckets: 720p uses 960).
    "target_size": 640,
    # Recorded, never read by forward (the conversion script's 720p t2v value).
    "task_type": "t2v",
    "use_meanflow": False,  # only the step-distilled i2v checkpoint uses it
}

# AutoencoderKLHunyuanVideo15: the real config is the class default (block widths
# 128..1024, 2 layers per block, 16x spatial / 4x temporal, scaling 1.03682). Here a
# sixteenth of the widths (the last must stay a multiple of 2 x 32 latent channels: the
# encoder's and decoder's channel shortcuts) and one layer per block.
VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": LATENT_CHANNELS,
    "block_out_channels": [8, 16, 32, 64, 64],
    "layers_per_block": 1,
    "spatial_compression_ratio": 16,  # real
    "temporal_compression_ratio": 4,  # real
    "downsample_match_channel": True,
    "upsample_match_channel": True,
    "scaling_factor": 1.03682,  # real
}

# FlowMatchEulerDiscreteScheduler(shift=5.0): the 480p t2v conversion (720p t2v: 9.0);
# the pipeline passes linear sigmas 1 -> 0, which the fixed shift bends.
SCHEDULER_CONFIG: dict[str, Any] = {"shift": 5.0}

# ClassifierFreeGuidance(guidance_scale=6.0): the real non-distilled checkpoints' (1.0,
# i.e. a single pass, for the distilled ones).
GUIDER_CONFIG: dict[str, Any] = {"guidance_scale": 6.0}

# Qwen2_5_VLTextModel (the pipeline reads hidden_states[-3], so 3 layers: the real
# 28-layer model's third-to-last is a transformer layer's output too). Real: 3584
# wide, 28 heads / 4 KV heads, rope theta 1e6, mrope sections [16, 24, 24] of the
# 64-wide rotary half. Special token ids come from the tokenizer (set by the builder).
QWEN_TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": QWEN_TEXT_HIDDEN,
    "intermediate_size": 2 * QWEN_TEXT_HIDDEN,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # grouped-query attention
    # The pipeline pads every prompt to 1000 + 108 tokens.
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1000000.0,
        # (temporal, height, width) sections of the 8-wide rotary half.
        "mrope_section": [2, 3, 3],
    },
    "tie_word_embeddings": False,
}

# T5EncoderModel as ByT5-small (Glyph-SDXL-v2's text tower): gated GELU, byte
# vocabulary (size from the tokenizer). Real: 1472 wide, 12 layers, 6 heads x 64.
BYT5_CONFIG: dict[str, Any] = {
    "d_model": BYT5_HIDDEN,
    "d_kv": 8,
    "d_ff": 2 * BYT5_HIDDEN,
    "num_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "is_encoder_decoder": False,
    "use_cache": False,
    "tie_word_embeddings": False,
}


def model_index() -> dict[str, Any]:
    """model_index.json's entries (without ``_diffusers_version``), the classes a
    converted real checkpoint names."""
    return {
        "_class_name": PIPELINE,
        "guider": ["diffusers", "ClassifierFreeGuidance"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen2_5_VLTextModel"],
        "text_encoder_2": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "tokenizer_2": ["transformers", "ByT5Tokenizer"],
        "transformer": ["diffusers", "HunyuanVideo15Transformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLHunyuanVideo15"],
    }
