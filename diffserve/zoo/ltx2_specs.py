"""Architecture configs of the hermetic LTX-2 pipeline (``tiny-ltx2``): text to video
with a synchronised audio track (``diffusers.LTX2Pipeline``).

LTX-2.0's geometry (``Lightricks/LTX-2`` as diffusers' conversion script writes it)
with a fraction of the width: a two-stream DiT (video and audio tokens, each with self-
and text cross-attention, plus audio-to-video and video-to-audio cross-attention every
block), 128 video latent channels under a VAE with 32x spatial and 8x temporal
compression (1x1x1 transformer patches), an audio VAE over a 64-bin stereo mel
spectrogram at 16 kHz / hop 160 (8 latent channels, 4x compression in time and
frequency), a vocoder that turns the mel frames back into 24 kHz stereo audio (x240
upsampling), text connectors with 128 learnable registers, a Gemma-3 text encoder
whose every hidden state is stacked (embeddings + each layer) and the real flow-matching
scheduler config. Only widths and depths shrink, so every code path of the real
checkpoint runs and the audio is real audio. Plain dicts (no torch).
"""

from __future__ import annotations

from typing import Any

# --- Gemma-3 text encoder
# ---------------------------------------------------------------------
# Gemma-3-12B: hidden 3840 (= the connectors' and transformer's caption_channels), 48
# layers; the pipeline stacks all 49 hidden states (text_proj_in_factor).
GEMMA_HIDDEN = 64
GEMMA_LAYERS = 2
GEMMA_HEAD_DIM = 16
# The pipeline pads every prompt to max_sequence_length=1024 tokens (left padding), the
# number the connectors' registers tile (1024 % 128 == 0).
MAX_SEQUENCE_LENGTH = 1024


def gemma3_config() -> dict[str, Any]:
    """Gemma3ForConditionalGeneration's config (text + SigLIP vision tower); the token
    ids (vocabulary, specials, image tokens) come from the tokenizer the builder
    writes."""
    return {
        "text_config": {
            "hidden_size": GEMMA_HIDDEN,
            "intermediate_size": 2 * GEMMA_HIDDEN,
            "num_hidden_layers": GEMMA_LAYERS,
            "num_attention_heads": 4,  # 16 in the real one
            "num_key_value_heads": 2,  # 8: grouped-query attention, as real
            "head_dim": GEMMA_HEAD_DIM,
            # = head_dim, as the real one's 256 is its head_dim
            "query_pre_attn_scalar": GEMMA_HEAD_DIM,
            "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-6,
            # Real: five sliding-window layers then a global one; here one of each so
            # both attention kinds run.
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 1024,
            # Real: global layers use linear RoPE scaling x8 at theta 1e6, local ones
            # theta 1e4.
            "rope_parameters": {
                "full_attention": {
                    "rope_type": "linear",
                    "factor": 8.0,
                    "rope_theta": 1000000.0,
                },
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            "attention_bias": False,
            "tie_word_embeddings": True,
        },
        # SigLIP at 896px / patch 14 with 256 image tokens in the real one; never run by
        # text-to-video, kept so the class and its weights' layout match.
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "vision_use_head": False,
        },
        "mm_tokens_per_image": 4,
    }


# --- text connectors
# -------------------------------------------------------------------------
# LTX2TextConnectors (LTX-2.0: one shared text_proj_in, per-modality 1D transformers).
# The connectors' width must equal caption_channels (30 heads x 128 = 3840 real).
CONNECTORS_CONFIG: dict[str, Any] = {
    "caption_channels": GEMMA_HIDDEN,
    "text_proj_in_factor": GEMMA_LAYERS + 1,  # 49 real: embeddings + 48 layers
    "video_connector_num_attention_heads": 2,
    "video_connector_attention_head_dim": GEMMA_HIDDEN // 2,
    "video_connector_num_layers": 2,  # real
    "video_connector_num_learnable_registers": 128,  # real
    "audio_connector_num_attention_heads": 2,
    "audio_connector_attention_head_dim": GEMMA_HIDDEN // 2,
    "audio_connector_num_layers": 2,  # real
    "audio_connector_num_learnable_registers": 128,  # real
    "connector_rope_base_seq_len": 4096,  # real
    "rope_theta": 10000.0,
    "rope_double_precision": True,
    "causal_temporal_positioning": False,
    "rope_type": "split",  # real
}

# --- transformer
# ------------------------------------------------------------------------------
VIDEO_LATENT_CHANNELS = 128  # real
AUDIO_LATENT_CHANNELS = 8  # real
AUDIO_MEL_BINS = 64  # real
AUDIO_COMPRESSION = 4  # the audio VAE's fixed time and mel downsampling (diffusers)
# The audio stream's token width: latent channels x latent mel bins (8 x 16 = 128, real)
AUDIO_TOKEN_CHANNELS = AUDIO_LATENT_CHANNELS * (AUDIO_MEL_BINS // AUDIO_COMPRESSION)
AUDIO_SAMPLE_RATE = 16000  # the mel spectrogram's rate (real)
AUDIO_HOP_LENGTH = 160  # real: 100 mel frames a second

# Video stream 2 heads x 32 (32 x 128 = 4096 real), audio stream 2 x 16 (32 x 64 = 2048
# real). The heads counts must match: the a2v/v2a RoPE is built with the video head
# count and applied to audio-head-shaped queries ("split" RoPE), as in the real one (32
# and 32).
TRANSFORMER_CONFIG: dict[str, Any] = {
    "in_channels": VIDEO_LATENT_CHANNELS,
    "out_channels": VIDEO_LATENT_CHANNELS,
    "patch_size": 1,  # real
    "patch_size_t": 1,  # real
    "num_attention_heads": 2,
    "attention_head_dim": 32,
    "cross_attention_dim": 64,  # = the video width (4096 real)
    "vae_scale_factors": (8, 32, 32),  # real: the VAE's (time, height, width) ratios
    "pos_embed_max_pos": 20,  # real
    "base_height": 2048,  # real
    "base_width": 2048,  # real
    "audio_in_channels": AUDIO_TOKEN_CHANNELS,
    "audio_out_channels": AUDIO_TOKEN_CHANNELS,
    "audio_patch_size": 1,
    "audio_patch_size_t": 1,
    "audio_num_attention_heads": 2,
    "audio_attention_head_dim": 16,
    "audio_cross_attention_dim": 32,  # = the audio width (2048 real)
    "audio_scale_factor": AUDIO_COMPRESSION,
    "audio_pos_embed_max_pos": 20,  # real
    "audio_sampling_rate": AUDIO_SAMPLE_RATE,
    "audio_hop_length": AUDIO_HOP_LENGTH,
    "num_layers": 2,  # 48 real
    "activation_fn": "gelu-approximate",
    "qk_norm": "rms_norm_across_heads",
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "caption_channels": GEMMA_HIDDEN,
    "attention_bias": True,
    "attention_out_bias": True,
    "rope_theta": 10000.0,
    "rope_double_precision": True,
    "causal_offset": 1,
    "timestep_scale_multiplier": 1000,
    "cross_attn_timestep_scale_multiplier": 1000,
    "rope_type": "split",  # real
}

# --- video VAE
# --------------------------------------------------------------------------------
# AutoencoderKLLTX2Video: 4x4 pixel patches, then four downsampling blocks (spatial,
# temporal, spatiotemporal, spatiotemporal) = 32x spatial, 8x temporal: frames come in
# 8k+1, sizes in multiples of 32. Widths 1/16 of the real (256, 512, 1024, 2048) and
# one resnet per block (real (4, 6, 6, 2, 2) / (5, 5, 5, 5)).
VIDEO_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": VIDEO_LATENT_CHANNELS,
    "block_out_channels": (16, 32, 64, 128),
    "down_block_types": ("LTX2VideoDownBlock3D",) * 4,
    "decoder_block_out_channels": (16, 32, 64),
    "layers_per_block": (1, 1, 1, 1, 1),
    "decoder_layers_per_block": (1, 1, 1, 1),
    "spatio_temporal_scaling": (True, True, True, True),
    "decoder_spatio_temporal_scaling": (True, True, True),
    "decoder_inject_noise": (False, False, False, False),
    "downsample_type": ("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
    "upsample_type": ("spatiotemporal", "spatiotemporal", "spatiotemporal"),
    "upsample_residual": (True, True, True),
    "upsample_factor": (2, 2, 2),
    "timestep_conditioning": False,  # real (LTX-2.0 dev)
    "patch_size": 4,
    "patch_size_t": 1,
    "resnet_norm_eps": 1e-6,
    "encoder_causal": True,
    "decoder_causal": False,
    "encoder_spatial_padding_mode": "zeros",
    "decoder_spatial_padding_mode": "reflect",
    # Given explicitly, as the real config does: the class would derive 64 / 16 from
    # the four scaling flags.
    "spatial_compression_ratio": 32,
    "temporal_compression_ratio": 8,
}

# --- audio VAE
# --------------------------------------------------------------------------------
# AutoencoderKLLTX2Audio: causal 2D convolutions over (time, mel) of a stereo
# spectrogram, three levels (two 2x downsamples = the 4x the pipeline assumes).
# base_channels stays at the real 128: diffusers sizes the latents' mean/std buffers by
# it and the pipeline applies them to the packed audio tokens (8 x 16 = 128 wide), so
# any other value breaks denormalisation. The width saving is ch_mult (1, 2, 4) -> all
# ones and one resnet per level (2 real).
AUDIO_VAE_CONFIG: dict[str, Any] = {
    "base_channels": AUDIO_TOKEN_CHANNELS,
    "output_channels": 2,  # stereo (real)
    "ch_mult": (1, 1, 1),
    "num_res_blocks": 1,
    "attn_resolutions": None,
    "in_channels": 2,
    "resolution": 256,
    "latent_channels": AUDIO_LATENT_CHANNELS,
    "norm_type": "pixel",
    "causality_axis": "height",
    "dropout": 0.0,
    "mid_block_add_attention": False,
    "sample_rate": AUDIO_SAMPLE_RATE,
    "mel_hop_length": AUDIO_HOP_LENGTH,
    "is_causal": True,
    "mel_bins": AUDIO_MEL_BINS,
    "double_z": True,
}

# --- vocoder
# ----------------------------------------------------------------------------------
# LTX2Vocoder (HiFi-GAN style): stereo x 64 mel bins in, upsampling 6x5x2x2x2 = 240 =
# 24000 / (16000 / 160), so 100 mel frames a second become 24 kHz audio, the real
# output rate (what the pipeline's audio is played at: vocoder.config
# .output_sampling_rate). Width 1/16 of the real 1024 (halved at each upsample: 2
# channels at 24 kHz).
VOCODER_SAMPLE_RATE = 24000
VOCODER_CONFIG: dict[str, Any] = {
    "in_channels": 2 * AUDIO_MEL_BINS,
    "hidden_channels": 64,
    "out_channels": 2,
    "upsample_kernel_sizes": [16, 15, 8, 4, 4],
    "upsample_factors": [6, 5, 2, 2, 2],
    "resnet_kernel_sizes": [3, 7, 11],
    "resnet_dilations": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "leaky_relu_negative_slope": 0.1,
    "output_sampling_rate": VOCODER_SAMPLE_RATE,
}

# --- scheduler
# --------------------------------------------------------------------------------
# The real scheduler_config.json: flow matching with a resolution-dependent exponential
# shift (mu from the video token count) and a terminal sigma of 0.1.
SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.95,
    "max_shift": 2.05,
    "base_image_seq_len": 1024,
    "max_image_seq_len": 4096,
    "shift_terminal": 0.1,
    "time_shift_type": "exponential",
    "invert_sigmas": False,
    "stochastic_sampling": False,
    "use_beta_sigmas": False,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}

# model_index.json's component entries, as the real repository names them; the
# optional prompt enhancer, its processor and the duration head (LTX-2.5) are absent.
MODEL_INDEX: dict[str, Any] = {
    "_class_name": "LTX2Pipeline",
    "audio_vae": ["diffusers", "AutoencoderKLLTX2Audio"],
    "connectors": ["ltx2", "LTX2TextConnectors"],
    "duration_head": [None, None],
    "processor": [None, None],
    "prompt_enhancer": [None, None],
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "Gemma3ForConditionalGeneration"],
    "tokenizer": ["transformers", "GemmaTokenizerFast"],
    "transformer": ["diffusers", "LTX2VideoTransformer3DModel"],
    "vae": ["diffusers", "AutoencoderKLLTX2Video"],
    "vocoder": ["ltx2", "LTX2Vocoder"],
}
