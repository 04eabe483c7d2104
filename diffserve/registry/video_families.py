"""The video families: Wan2.1/2.2 (native denoiser), and on the generic path
LTX-2 (a video with its audio track) and HunyuanVideo-1.5."""

from __future__ import annotations

from diffserve.registry.family import (
    CFG_TIMES_ULYSSES,
    GENERIC_PIPELINE,
    NATIVE_STEP_CACHES,
    FamilyDefaults,
    Features,
    GenericPath,
    ModelFamily,
)

WAN_PIPELINE = "diffserve.models.wan.pipeline:WanVideoPipeline"
WAN_QUANTIZATION_IGNORED = ("patch_embedding", "condition_embedder", "proj_out")
# LTX-2's attention call sites: each stream's self-attention and cross-attention to the
# text, and the audio<->video attention between them.
LTX2_ROLES = (
    "self_attention",
    "audio_self_attention",
    "cross_attention",
    "audio_cross_attention",
    "audio_video_attention",
)

VIDEO_FAMILIES: tuple[ModelFamily, ...] = (
    # Wan2.1 / Wan2.2 text-to-video (Wan2.2's two experts: transformer +
    # transformer_2 by boundary_ratio) and Wan2.2 image-to-video: self-attention
    # over the video tokens, cross-attention to UMT5's; real CFG at 5.0 over 50
    # steps, 81 frames of 480x832 at 16 fps, as diffusers' __call__ and the Wan
    # repos.
    *(
        ModelFamily(
            name,
            WAN_PIPELINE,
            "single",
            ("self_attention", "cross_attention"),
            defaults=FamilyDefaults(
                50,
                5.0,
                max_sequence_length=512,
                num_frames=81,
                fps=16,
                height=480,
                width=832,
            ),
            parallel=CFG_TIMES_ULYSSES,
            features=Features(
                edits=edits,
                step_caches=NATIVE_STEP_CACHES,
                quantization_ignored_layers=WAN_QUANTIZATION_IGNORED,
            ),
        )
        for name, edits in (
            ("WanPipeline", ()),
            ("WanImageToVideoPipeline", ("first_frame",)),
        )
    ),
    # LTX-2: one transformer denoises a video and its audio together (video and audio
    # self-attention, each stream's cross-attention to the text, audio<->video
    # attention); the audio VAE and vocoder make a 24 kHz waveform, the MP4's audio
    # track. 30 steps at CFG 3.0, 121 frames of 512x768 at 24 fps, text up to 1024
    # tokens (a multiple of the connectors' 128 registers), as its __call__; its
    # spatio-temporal guidance pass is left off (LTX-2.0 weights: it changes nothing and
    # costs a forward a step).
    ModelFamily(
        "LTX2Pipeline",
        GENERIC_PIPELINE,
        "single",
        LTX2_ROLES,
        implementation="generic",
        defaults=FamilyDefaults(
            30,
            3.0,
            max_sequence_length=1024,
            num_frames=121,
            fps=24,
            height=512,
            width=768,
        ),
        generic=GenericPath(
            role_patterns=(
                (".audio_attn1.", "audio_self_attention"),
                (".attn1.", "self_attention"),
                (".audio_attn2.", "audio_cross_attention"),
                (".attn2.", "cross_attention"),
                ("_to_video_attn.", "audio_video_attention"),
                ("_to_audio_attn.", "audio_video_attention"),
            ),
            masked_roles=("cross_attention", "audio_cross_attention"),
            call_overrides=(("stg_scale", 0.0), ("audio_stg_scale", 0.0)),
            text_window_multiple=128,
        ),
        features=Features(
            output_extras=("audio",),
            quantization_ignored_layers=(
                "proj_in",
                "audio_proj_in",
                "proj_out",
                "audio_proj_out",
                "caption_projection.*",
                "audio_caption_projection.*",
                "time_embed.*",
                "audio_time_embed.*",
                "av_cross_attn_*",
            ),
        ),
    ),
    # HunyuanVideo-1.5: joint attention over [video, text] tokens (a dense per-sample
    # mask: the text is packed, its padding masked) after a token refiner over the Qwen
    # text alone; a Qwen2.5-VL encoder and a ByT5 glyph encoder for quoted text. CFG
    # lives in its guider (6.0), 50 steps, 121 frames of 480x848 at 24 fps. Its
    # __call__ has no step callback: the step hook is the scheduler's step.
    ModelFamily(
        "HunyuanVideo15Pipeline",
        GENERIC_PIPELINE,
        "single",
        ("joint_block", "text_refiner"),
        implementation="generic",
        defaults=FamilyDefaults(
            50,
            6.0,
            max_sequence_length=1000,
            num_frames=121,
            fps=24,
            height=480,
            width=848,
        ),
        generic=GenericPath(
            role_patterns=(
                ("context_embedder.", "text_refiner"),
                ("transformer_blocks.", "joint_block"),
            ),
            masked_roles=("joint_block", "text_refiner"),
            guider=True,
            vae_slicing=True,
            text_window_attribute="tokenizer_max_length",
        ),
        features=Features(
            quantization_ignored_layers=(
                "time_embed.*",
                "context_embedder.time_text_embed.*",
                "context_embedder.proj_in",
                "context_embedder.token_refiner.*.norm_out.*",
                "context_embedder_2.*",
                "image_embedder.*",
                "*.norm1.*",
                "*.norm1_context.*",
                "norm_out.*",
                "proj_out",
            )
        ),
    ),
)
