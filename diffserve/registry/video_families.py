"""The video families: Wan2.1/2.2 (native denoiser), and on the generic path
LTX-2 (a video with its audio track) and HunyuanVideo-1.5."""

from __future__ import annotations

from diffserve.registry.family import (
    CFG_TIMES_ULYSSES,
    NATIVE_STEP_CACHES,
    FamilyDefaults,
    Features,
    ModelFamily,
)

WAN_PIPELINE = "diffserve.models.wan.pipeline:WanVideoPipeline"
WAN_QUANTIZATION_IGNORED = ("patch_embedding", "condition_embedder", "proj_out")

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
)
