"""Model families: the one list of what diffserve serves, keyed by
``model_index.json``'s ``_class_name``.

The resolver reads it for model defaults (topology, implementation, request defaults),
the attention roles a deploy file may name and the "supported: ..." hint; the worker
reads it to build the pipeline.

Two implementations: ``native`` families have their own denoiser under
``diffserve/models/<family>/``; ``generic`` families run diffusers' own pipeline class
with every ``nn.Linear`` and attention call of the denoiser moved onto our kernels
(``models/generic/``). Adding a generic text-to-image DiT pipeline is one entry here
(its attention roles by module name, its defaults) plus a builder for tests.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from diffserve.registry.family import (
    CFG_TIMES_ULYSSES,
    GENERIC_PIPELINE,
    MMDIT_ROLES,
    NATIVE_STEP_CACHES,
    FamilyDefaults,
    Features,
    GenericPath,
    ModelFamily,
)
from diffserve.registry.qwen_families import QWEN_IMAGE_FAMILIES
from diffserve.registry.video_families import VIDEO_FAMILIES

# Admission's check of a request's LoRA adapters on the native FLUX pipeline (files,
# shapes, scales).
FLUX_LORA_CHECK = "diffserve.models.flux.lora:check_lora_request"

# A model directory's own diffserve marker (written by the zoo's builders and trainers):
# what the directory is and, optionally, its ``request_defaults`` (read by
# config/sources.py as the model layer) and the ``example_prompts`` it knows
# (registry/example_prompts.py: the playground's first prompt).
MODEL_MARKER_FILE = "diffserve_model.json"


FLUX_PIPELINE = "diffserve.models.flux.pipeline:FluxPipeline"
# FLUX's text encoders as a stage of their own (topology split_text_encoder).
FLUX_STAGES = (
    ("text_encoder", "diffserve.models.flux.encode_pipeline:FluxEncodePipeline"),
    ("decoder", "diffserve.models.flux.decode_pipeline:FluxDecodePipeline"),
)

# FLUX.1's transformer: native module names (models/flux/transformer.py, BFL's) and
# diffusers' (generic path).
FLUX_QUANTIZATION_IGNORED = (
    "img_in",
    "txt_in",
    "time_in",
    "vector_in",
    "guidance_in",
    "final_layer",
    "x_embedder",
    "context_embedder",
    "time_text_embed",
    "norm_out",
    "proj_out",
)
# The per-block adaLN modulation too (a quarter of FLUX.1's weights: keeping it leaves
# int8 at 0.93x bfloat16's bytes on small-flux instead of 0.50x, for 65 instead of 55
# dB; docs/quantization.md).
FLUX_MODULATION = (
    "*.img_mod",
    "*.txt_mod",
    "*.modulation",
    "*.norm1",
    "*.norm1_context",
    "single_transformer_blocks.*.norm",
)

# What the native FLUX pipeline reads from single files:
# models/flux/checkpoint_layouts.py (transformer), models/vae_file.py,
# models/text_encoder_file.py (CLIP-L, T5-XXL).
FLUX_SINGLE_FILES = ("transformer", "vae", "text_encoder", "text_encoder_2")


FLUX_ROLES = ("double_block", "single_block")
# implementation: generic runs diffusers' FluxPipeline with these roles.
FLUX_GENERIC = GenericPath(
    role_patterns=(
        ("single_transformer_blocks.", "single_block"),
        ("transformer_blocks.", "double_block"),
    )
)
FLUX_FEATURES = Features(
    lora_check=FLUX_LORA_CHECK,
    step_caches=NATIVE_STEP_CACHES,
    quantization_ignored_layers=FLUX_QUANTIZATION_IGNORED,
    gpu_quantization_ignored_layers=("*_mod.lin", "*.modulation.lin"),
    stage_pipelines=FLUX_STAGES,
    single_file_components=FLUX_SINGLE_FILES,
)
MODEL_FAMILIES: dict[str, ModelFamily] = {
    family.class_name: family
    for family in (
        ModelFamily(
            "FluxPipeline",
            FLUX_PIPELINE,
            "single",
            FLUX_ROLES,
            generic=FLUX_GENERIC,
            parallel=CFG_TIMES_ULYSSES,
            features=replace(FLUX_FEATURES, edits=("img2img", "inpaint")),
        ),
        # FLUX.1 Kontext: the native FLUX pipeline, with the reference image's latents
        # as extra tokens.
        ModelFamily(
            "FluxKontextPipeline",
            FLUX_PIPELINE,
            "single",
            FLUX_ROLES,
            generic=FLUX_GENERIC,
            features=replace(FLUX_FEATURES, edits=("reference",)),
        ),
        # SD3/SD3.5 (MMDiT): every block's joint text+image attention; true CFG in the
        # pipeline itself (guidance_scale is the CFG scale), 28 steps at 7.0 as the
        # pipeline's __call__ defaults.
        ModelFamily(
            "StableDiffusion3Pipeline",
            GENERIC_PIPELINE,
            "single",
            ("joint_block",),
            implementation="generic",
            defaults=FamilyDefaults(28, 7.0, max_sequence_length=256),
            generic=replace(MMDIT_ROLES),
            features=Features(
                quantization_ignored_layers=(
                    "pos_embed",
                    "time_text_embed",
                    "context_embedder",
                    "*.norm1",
                    "*.norm1_context",
                    "norm_out",
                    "proj_out",
                )
            ),
        ),
        # PixArt-Sigma: self-attention over the image, cross-attention to the (padded,
        # masked) T5 tokens; 20 steps at CFG 4.5 as its __call__ defaults; T5 up to 300
        # tokens.
        ModelFamily(
            "PixArtSigmaPipeline",
            GENERIC_PIPELINE,
            "single",
            ("self_attention", "cross_attention"),
            implementation="generic",
            defaults=FamilyDefaults(20, 4.5, max_sequence_length=300),
            generic=GenericPath(
                role_patterns=(
                    (".attn1", "self_attention"),
                    (".attn2", "cross_attention"),
                ),
                masked_roles=("cross_attention",),
                call_overrides=(("use_resolution_binning", False),),
            ),
            features=Features(
                quantization_ignored_layers=(
                    "pos_embed",
                    "adaln_single",
                    "caption_projection",
                    "proj_out",
                )
            ),
        ),
        *QWEN_IMAGE_FAMILIES,
        # Z-Image (a single-stream DiT, a Qwen3 text encoder): refiner blocks over the
        # image and the text tokens alone, then joint blocks over both, every call
        # masked (a batch pads its sequences); CFG at 5.0 over 50 steps as its __call__
        # (Z-Image-Turbo's own card uses 9 steps at 0: set them in the deploy file).
        ModelFamily(
            "ZImagePipeline",
            GENERIC_PIPELINE,
            "single",
            ("image_refiner", "text_refiner", "joint_block"),
            implementation="generic",
            defaults=FamilyDefaults(50, 5.0, max_sequence_length=512),
            generic=GenericPath(
                role_patterns=(
                    ("noise_refiner.", "image_refiner"),
                    ("context_refiner.", "text_refiner"),
                    ("layers.", "joint_block"),
                ),
                masked_roles=("image_refiner", "text_refiner", "joint_block"),
            ),
            features=Features(
                quantization_ignored_layers=(
                    "all_x_embedder.*",
                    "all_final_layer.*",
                    "t_embedder.*",
                    "cap_embedder.*",
                    "*.adaLN_modulation",
                )
            ),
        ),
        # FLUX.2-klein (a Qwen3 text encoder) and FLUX.2-dev (a Mistral3 one): FLUX.2's
        # MMDiT, double- and single-stream blocks as FLUX.1, 50 steps at 4.0 as their
        # __call__. klein runs real CFG (one forward each for the prompt and the empty
        # prompt); dev's guidance is distilled (embedded, one forward a step). Neither
        # __call__ takes a negative prompt.
        *(
            ModelFamily(
                name,
                GENERIC_PIPELINE,
                "single",
                FLUX_ROLES,
                implementation="generic",
                defaults=FamilyDefaults(50, 4.0, max_sequence_length=512),
                generic=FLUX_GENERIC,
                features=Features(
                    quantization_ignored_layers=(
                        "x_embedder",
                        "context_embedder",
                        "time_guidance_embed.*",
                        "double_stream_modulation_*",
                        "single_stream_modulation.*",
                        "norm_out.*",
                        "proj_out",
                    )
                ),
            )
            for name in ("Flux2KleinPipeline", "Flux2Pipeline")
        ),
        *VIDEO_FAMILIES,
    )
}


def register_family(family: ModelFamily) -> None:
    """Serve ``family`` (an out-of-tree native family: its hooks class named by
    ``family.pipeline``). Call it in every process that resolves or builds the model:
    the server before it resolves, and each worker, e.g. from the ``before_load`` of a
    ``worker_extension_cls`` (docs/architecture.md, "Add a native family"). Registering
    the same entry again is a no-op; another entry under a built-in's name is
    refused."""
    known = MODEL_FAMILIES.get(family.class_name)
    if known is not None and known != family:
        raise ValueError(f"{family.class_name} is already a registered family")
    MODEL_FAMILIES[family.class_name] = family


def known_attention_roles() -> tuple[str, ...]:
    """Every role some family declares (what a deploy file may name before the model is
    known)."""
    return tuple(
        dict.fromkeys(
            role for f in MODEL_FAMILIES.values() for role in f.attention_roles
        )
    )


def known_single_file_components() -> tuple[str, ...]:
    """Every component some family reads from a single file (what ``components`` may
    name before the model is known; the family's own list is checked at resolve)."""
    return tuple(
        dict.fromkeys(
            c
            for f in MODEL_FAMILIES.values()
            for c in f.features.single_file_components
        )
    )


def read_class_name(model_dir: str | Path) -> str:
    """``_class_name`` of ``model_dir/model_index.json`` (OSError/ValueError/KeyError
    propagate)."""
    index = Path(model_dir) / "model_index.json"
    return str(json.loads(index.read_text(encoding="utf-8"))["_class_name"])


@functools.lru_cache(maxsize=64)
def makes_videos(model_dir: str | Path | None) -> bool:
    """Whether the (local) model directory is a video family's (its registry entry has
    frames). Cached: the images API asks on every request, and a served directory's
    model_index.json does not change under it."""
    try:
        family = MODEL_FAMILIES.get(read_class_name(model_dir)) if model_dir else None
    except (OSError, ValueError, KeyError):
        return False
    return family is not None and family.defaults.modality == "video"


def denoiser_components(index: Mapping[str, Any]) -> list[str]:
    """The denoiser components a ``model_index.json`` declares: ``transformer``, and
    Wan2.2's low-noise expert ``transformer_2`` when set (diffusers writes ``[null,
    null]`` for an absent one)."""
    return [
        "transformer",
        *(["transformer_2"] if (index.get("transformer_2") or [None])[0] else []),
    ]
