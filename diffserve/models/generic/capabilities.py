"""What a loaded diffusers pipeline can serve (``PipelineCapabilities``), read off the
pipeline object itself: its size multiple, default size and, for a video family, its
frame rule and, where it makes sound (LTX-2), the sample rate of its waveform.

diffusers' video pipelines name their compression factors in two dialects (HunyuanVideo
1.5, Wan: ``vae_scale_factor_spatial``/``_temporal``; LTX-2:
``vae_spatial_compression_ratio``/``vae_temporal_compression_ratio`` and
``transformer_*_patch_size``): both are read, first match wins.
"""

from __future__ import annotations

from typing import Any

from diffserve.config.stage_sections import CacheConfig
from diffserve.models.base import PipelineCapabilities
from diffserve.registry.family import ModelFamily
from diffserve.types.capabilities import VideoCapabilities


def _first_int(owner: Any, names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def _patch(config: Any, names: tuple[str, ...]) -> int:
    """A patch size of the denoiser's config (an int, or a (t, h, w) list)."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
        if isinstance(value, list | tuple) and value:
            return int(value[-1])  # (t, h, w): the spatial one
    return 1


def _video(pipe: Any, family: ModelFamily, denoiser: Any) -> VideoCapabilities | None:
    defaults = family.defaults
    if defaults.modality != "video":
        return None
    vae = _first_int(
        pipe, ("vae_scale_factor_temporal", "vae_temporal_compression_ratio"), 4
    )
    patch = _first_int(pipe, ("transformer_temporal_patch_size",), 0) or _patch(
        denoiser.config, ("patch_size_t",)
    )
    vocoder = getattr(pipe, "vocoder", None)
    rate = int(getattr(getattr(vocoder, "config", None), "output_sampling_rate", 0))
    return VideoCapabilities(
        temporal_factor=vae * patch,
        default_height=defaults.height,
        default_width=defaults.width,
        audio_sample_rate=rate,
    )


def size_multiple(pipe: Any, denoiser: Any) -> tuple[int, int]:
    """(the VAE's spatial factor, the multiple a request's height and width must be)."""
    vae_factor = _first_int(
        pipe,
        (
            "vae_scale_factor_spatial",
            "vae_spatial_compression_ratio",
            "vae_scale_factor",
        ),
        8,
    )
    spatial_patch = getattr(pipe, "transformer_spatial_patch_size", None)
    patch = (
        int(spatial_patch)
        if isinstance(spatial_patch, int)
        else _patch(denoiser.config, ("patch_size",))
    )
    # Pipelines that pack 2x2 latent patches outside the denoiser (FLUX, Qwen-Image,
    # Z-Image: patch_size 1 or absent in its config) say so in their image processor's
    # factor.
    processor = getattr(getattr(pipe, "image_processor", None), "config", None)
    multiple = max(
        vae_factor * patch, int(getattr(processor, "vae_scale_factor", vae_factor))
    )
    return vae_factor, multiple


def generic_capabilities(
    pipe: Any,
    family: ModelFamily,
    call_params: frozenset[str],
    *,
    lora: bool,
    cache: CacheConfig,
    step_cache: bool,
) -> PipelineCapabilities:
    """The capabilities of diffusers' pipeline ``pipe`` of ``family`` (its ``__call__``
    keywords ``call_params``)."""
    denoiser = getattr(pipe, family.denoiser)
    vae_factor, multiple = size_multiple(pipe, denoiser)
    multiple = family.generic.size_multiple or multiple
    sample = getattr(denoiser.config, "sample_size", None) or 128
    if isinstance(sample, list | tuple):
        sample = sample[-1]
    # The family's own default side where its pipeline has no sample size to read
    # (Qwen-Image-2.1: ``output_resolution`` 1024).
    default = family.defaults.height or (
        int(getattr(pipe, "default_sample_size", sample)) * vae_factor
    )
    video = _video(pipe, family, denoiser)
    return PipelineCapabilities(
        family=family.class_name,
        default_size=default,
        size_multiple=multiple,
        max_sequence_length=family.defaults.max_sequence_length,
        true_cfg=False,
        attention_roles=family.attention_roles,
        step_batching=False,
        implementation="generic",
        lora=lora,
        edits=family.features.edits,
        edit_strength="strength" in call_params,
        min_inference_steps=2
        if getattr(pipe.scheduler.config, "shift_terminal", None)
        else 1,
        default_cache_threshold=cache.request_threshold if step_cache else 0.0,
        negative_prompt="negative_prompt" in call_params,
        video=video,
        token_pixels=multiple,
    )
