"""Architecture configs of the hermetic Z-Image pipeline, and the Qwen3 text encoder it
shares with FLUX.2-klein (``flux2_specs``): a Qwen3 language model read through its chat
template.

Z-Image (``ZImagePipeline``): a single-stream DiT whose text and image tokens each pass
refiner blocks first, FLUX.1's VAE, a fixed flow shift of 3, and the Qwen3 model's
second-to-last hidden state as the caption features. Widths shrink, the geometry stays.
Plain dicts (no torch).
"""

from __future__ import annotations

from typing import Any

from diffserve.zoo.flux_specs import VAE_CONFIG

QWEN3_HIDDEN = 64

# Qwen3's chat template, as far as the pipelines use it: one user turn, the generation
# prompt, and the empty thinking block Qwen3 writes when ``enable_thinking`` is false
# (FLUX.2-klein; Z-Image asks for thinking).
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking "
    "is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)


def qwen3_config(*, layers: int) -> dict[str, Any]:
    """A Qwen3 language model (grouped-query attention, per-head q/k norms); ids are set
    by the builder."""
    return {
        "hidden_size": QWEN3_HIDDEN,
        "intermediate_size": 2 * QWEN3_HIDDEN,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": QWEN3_HIDDEN // 4,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": True,
    }


# --- Z-Image
# --------------------------------------------------------------------------------------
# Z-Image-Turbo's scheduler_config.json: a fixed shift of 3.
Z_IMAGE_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}
# FLUX.1's VAE layout and normalisation.
Z_IMAGE_VAE_CONFIG: dict[str, Any] = dict(VAE_CONFIG)


def z_image_transformer(*, layers: int, heads: int, head_dim: int) -> dict[str, Any]:
    """ZImageTransformer2DModel; the RoPE axes split the head as the real [32, 48, 48]
    does 128."""
    assert head_dim == 32, "axes_dims below splits a 32-wide head"
    return {
        "all_patch_size": [2],
        "all_f_patch_size": [1],
        "in_channels": 16,
        "dim": heads * head_dim,
        "n_layers": layers,
        "n_refiner_layers": 1,
        "n_heads": heads,
        "n_kv_heads": heads,
        "norm_eps": 1e-5,
        "qk_norm": True,
        "cap_feat_dim": QWEN3_HIDDEN,
        "rope_theta": 256.0,
        "t_scale": 1000.0,
        "axes_dims": [8, 12, 12],
        "axes_lens": [1024, 512, 512],
    }
