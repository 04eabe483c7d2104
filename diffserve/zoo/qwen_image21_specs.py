"""Architecture configs of the hermetic Qwen-Image-2.1 pipeline
(``tiny-qwen-image-21``).

The real family's geometry at a fraction of the width, so every code path of the real
checkpoint runs: a single-stream, block-causal DiT that reads unpatched latents
(``patch_size`` 1) over 64 latent channels, with one shared modulation, 3-axis RoPE and
``causal_condition`` (text tokens modulated from t = 0, which is what makes the prefix
KV cache valid); an RGBA VAE (4 image channels in and out, 16x spatial compression
through five ``dim_mult`` levels, residual up/down blocks, the real latent
normalisation); the flow-matching scheduler with Qwen-Image's dynamic exponential shift;
and a Qwen3-VL encoder (text model and vision tower: image-conditioned prompts run it)
whose last decoder layer, before the final norm, is the transformer's text input.

Where a value "mirrors the real checkpoint" it is the diffusers / transformers class
default, which those libraries set to Qwen-Image-2.1's released config, or the public
Qwen3-VL-8B config the encoder is built from; the scheduler is Qwen-Image's
``scheduler_config.json``, which public ports of 2.1 carry unchanged (the pipeline
reads the same keys; not checked against the hub here, which is offline). Plain dicts
for the constructors: cheap to import (no torch).
"""

from __future__ import annotations

from typing import Any

from diffserve.zoo.qwen_image_specs import QWEN_IMAGE_SCHEDULER_CONFIG

# The text model's width = the transformer's context_in_dim (Qwen3-VL-8B's 4096 in the
# real one).
QWEN3_VL_TEXT_HIDDEN = 64

# The real pipeline's system prompt, and the words of its templates: they join the
# tokenizer's corpus so that each is one token, as in Qwen's real vocabulary (the
# pipeline drops the system block by its token count, ``_drop_idx``).
QWEN_IMAGE21_TEMPLATE_TEXT = (
    "Comprehend and analyze the provided prompt. Picture image1 image2 image3"
)

# QwenImage21Pipeline's ``sample_sigmas`` (model_index.json). The base 2.1 checkpoint
# ships none, so ``num_inference_steps`` (default 40) sets the grid; the Turbo
# checkpoint ships a fixed grid, whose length then sets the step count.
SAMPLE_SIGMAS: list[float] | None = None

# Qwen-Image's scheduler_config.json, which 2.1 keeps: dynamic exponential shift by
# image sequence length (mu between base_shift and max_shift over 256..8192 tokens),
# stretched to a terminal sigma of 0.02. These override calculate_shift's fallbacks
# (0.5 / 1.15 over 256..4096). The stretch makes a one-step grid NaN (its single sigma
# 1.0 is scaled by 0 / 0): two steps at least.
QWEN_IMAGE21_SCHEDULER_CONFIG: dict[str, Any] = dict(QWEN_IMAGE_SCHEDULER_CONFIG)

# AutoencoderKLQwenImage21 at a 24th of the real widths (96 / 144). Everything else
# mirrors the real checkpoint: z_dim 64, dim_mult of five levels (16x spatial), residual
# blocks, temporal downsampling declared (unused on single images), RGBA in and out,
# and the class's latents_mean / latents_std (64 values each), left at their defaults.
QWEN_IMAGE21_VAE_CONFIG: dict[str, Any] = {
    "base_dim": 4,
    "decoder_base_dim": 6,
    "z_dim": 64,
    "dim_mult": [1, 2, 4, 8, 8],
    "num_res_blocks": 2,  # real
    "attn_scales": [],
    "temperal_downsample": [False, True, True, True],
    "dropout": 0.0,
    "is_residual": True,
    "in_channels": 4,  # RGBA: the pipeline converts condition images to RGBA
    "out_channels": 4,  # RGBA: decoded images carry alpha
    "patch_size": None,
    "scale_factor_temporal": 8,
    "scale_factor_spatial": 16,
}


def qwen_image21_transformer(
    *, layers: int, heads: int, head_dim: int
) -> dict[str, Any]:
    """QwenImage21Transformer2DModel (real: 32 layers of 32 heads x 128); the RoPE axes
    split the head as the real (16, 56, 56) splits 128 (a 32-wide head: a quarter of
    each)."""
    assert head_dim % 32 == 0, "the RoPE axes split the head as 1/8, 7/16, 7/16"
    return {
        "patch_size": 1,  # real: latents unpatched, one token per 16x16 pixels
        "in_channels": 64,  # real: the VAE's z_dim
        "out_channels": 64,
        "num_layers": layers,
        "attention_head_dim": head_dim,
        "num_attention_heads": heads,
        "context_in_dim": QWEN3_VL_TEXT_HIDDEN,
        "mlp_ratio": 3,  # real
        # (frame, height, width)
        "axes_dims_rope": [head_dim // 8, head_dim * 7 // 16, head_dim * 7 // 16],
        "eps": 1e-6,  # real
        "causal_condition": True,  # real; required by the prefix KV cache
    }


def qwen3_vl_config() -> dict[str, Any]:
    """Qwen3-VL's text and vision configs (the special token ids are the tokenizer's,
    set by the builder). Real: Qwen3-VL-8B, a 36-layer text model (32 query heads of
    128 over 8 KV heads, interleaved M-RoPE [24, 20, 20], theta 5e6) and a 27-block
    vision tower (patch 16, 2x2 merge, DeepStack taps at blocks 8, 16, 24)."""
    return {
        "text_config": {
            "hidden_size": QWEN3_VL_TEXT_HIDDEN,
            "intermediate_size": 3 * QWEN3_VL_TEXT_HIDDEN,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,  # grouped-query attention, 4:1 as the real 32/8
            "head_dim": 32,  # decoupled from the width, as in Qwen3
            "hidden_act": "silu",
            "max_position_embeddings": 262144,  # real (RoPE is computed, not stored)
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
            # Interleaved multimodal RoPE: (temporal, height, width) sections of the
            # head's rotary half, the real [24, 20, 20] of 64 scaled to 16.
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "out_hidden_size": QWEN3_VL_TEXT_HIDDEN,
            "patch_size": 16,  # real
            "spatial_merge_size": 2,  # real
            "temporal_patch_size": 2,  # real
            # Learned position grid, interpolated to the image (real: 48 x 48).
            "num_position_embeddings": 64,
            # DeepStack: features of these vision blocks are added to the first text
            # layers' hidden states.
            "deepstack_visual_indexes": [0, 1],
        },
    }


# Qwen3-VL's image processor (preprocessor_config.json): 16 px patches merged 2x2, so
# one vision token per 32x32 pixels; [-1, 1] normalisation; between 256 x 256 and
# 4096 x 4096 pixels. The class name is the real file's; the builder writes it through
# the PIL backend (no torchvision).
QWEN3_VL_IMAGE_PROCESSOR: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_size": 2,
    "patch_size": 16,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "temporal_patch_size": 2,
}

# Its video processor (video_preprocessor_config.json), written as plain JSON:
# transformers builds Qwen3VLVideoProcessor only with torchvision. Never run by the
# pipeline; a Qwen3VLProcessor load reads it.
QWEN3_VL_VIDEO_PROCESSOR: dict[str, Any] = {
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_sample_frames": True,
    "fps": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_frames": 768,
    "merge_size": 2,
    "min_frames": 4,
    "patch_size": 16,
    "processor_class": "Qwen3VLProcessor",
    "resample": 3,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "temporal_patch_size": 2,
    "video_processor_type": "Qwen3VLVideoProcessor",
}

# Qwen3-VL's chat template, as far as a prompt encoder uses it: system / user /
# assistant turns whose content is a string or a list of text, image and video parts,
# and the generation prompt. QwenImage21Pipeline renders its system message with it to
# count the tokens it drops.
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content "
    "or 'image_url' in content %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif content['type'] == 'video' or 'video' in content %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in content %}{{- content['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
