"""Admission: the one place a well-formed request meets this deployment and this model.

A ``GenerationRequest`` checked its own fields when it was built; here, once per
request, it is checked against the deployment's limits (``server.*``:
``LimitExceededError``, HTTP 422) and the loaded pipeline's declared capabilities
(``RequestError``, HTTP 400), and gets its seed. Nothing downstream validates again: the
scheduler, the worker and the pipeline trust what was admitted.
"""

from __future__ import annotations

from dataclasses import replace

from diffserve.config.schema import StageConfig
from diffserve.config.server_schema import ServerConfig
from diffserve.config.stage_sections import CacheConfig, RequestDefaultsConfig
from diffserve.errors import LimitExceededError, RequestError
from diffserve.registry.edits import admit_edit
from diffserve.registry.models import MODEL_FAMILIES
from diffserve.types.capabilities import PipelineCapabilities
from diffserve.types.request import GenerationRequest


def check_limits(request: GenerationRequest, server: ServerConfig) -> None:
    """The deployment's limits (on the request as admission filled it)."""
    # Prompts are tokenized and copied into image metadata: bound them before any of
    # that work.
    for name in ("prompt", "negative_prompt"):
        text = getattr(request, name)
        if text is not None and len(text) > server.max_prompt_chars:
            raise LimitExceededError(
                f"{name} has {len(text)} characters, above this server's limit of "
                f"{server.max_prompt_chars}",
                param=name,
            )
    if request.n > server.max_n:
        raise LimitExceededError(
            f"n={request.n} is above this server's limit of {server.max_n}", param="n"
        )
    height, width = request.height, request.width
    if height and width and height * width > server.max_pixels:
        raise LimitExceededError(
            f"size={width}x{height} has {width * height} pixels, above this server's "
            f"limit of {server.max_pixels}",
            param="size",
        )
    if (
        request.num_inference_steps is not None
        and request.num_inference_steps > server.max_steps
    ):
        raise LimitExceededError(
            f"num_inference_steps={request.num_inference_steps} is above this server's "
            f"limit of {server.max_steps}",
            param="num_inference_steps",
        )


def check_cache(request: GenerationRequest, cache: CacheConfig) -> GenerationRequest:
    """A request's ``cache_threshold`` against the stage's step cache; an unset one
    becomes the stage's, so requests that differ only in spelling the default batch
    together."""
    threshold = request.cache_threshold
    if cache.backend == "none" and threshold:
        raise RequestError(
            f"cache_threshold={threshold} needs a step cache, and "
            "this deployment has none "
            "(cache.backend: none); leave cache_threshold unset",
            param="cache_threshold",
        )
    if threshold is None:
        return replace(request, cache_threshold=cache.request_threshold)
    if threshold > cache.max_threshold:
        raise RequestError(
            f"cache_threshold={threshold} is above this deployment's "
            "cache.max_threshold "
            f"{cache.max_threshold}; use 0 (no caching) to {cache.max_threshold}",
            param="cache_threshold",
        )
    return request


def fill_defaults(
    request: GenerationRequest,
    defaults: RequestDefaultsConfig | None,
    capabilities: PipelineCapabilities | None = None,
) -> GenerationRequest:
    """Unset fields from the deployment's ``request_defaults`` (the model's own, source
    ``model``, unless the deployment set others) and the model's modality
    (``types/modality.py``: size, a video's clip, the text window). The only place an
    engine's requests get their defaults: nothing downstream fills."""
    # No model yet (a model-less engine): what the deployment says, nothing more.
    if capabilities is None:
        return request.with_defaults(
            defaults.num_inference_steps if defaults is not None else None,
            defaults.guidance_scale if defaults is not None else None,
            defaults.max_sequence_length if defaults is not None else None,
        )
    return capabilities.modality.fill(request, defaults, capabilities)


def check_loras(
    request: GenerationRequest,
    capabilities: PipelineCapabilities | None,
    stage: StageConfig | None,
    model_dir: str | None,
) -> GenerationRequest:
    """The request's LoRA adapters against the model and the deployment (names, allowed
    files, scales, count); returns the request with them in canonical form (sorted,
    paths resolved), so equal sets batch together."""
    if not request.loras:
        return request
    if capabilities is not None and not capabilities.lora:
        raise RequestError(
            f"{capabilities.family} ({capabilities.implementation}) "
            "does not apply LoRA adapters; "
            "leave loras empty",
            param="loras",
        )
    if stage is None or model_dir is None or capabilities is None:
        return request
    # The family owns what makes an adapter valid (files, shapes, rank):
    # registry.family.Features.lora_check.
    family = MODEL_FAMILIES[capabilities.family]
    return replace(request, loras=family.check_loras(request.loras, stage, model_dir))


def admit(
    request: GenerationRequest,
    server: ServerConfig,
    capabilities: PipelineCapabilities | None,
    cache: CacheConfig | None = None,
    defaults: RequestDefaultsConfig | None = None,
    *,
    stage: StageConfig | None = None,
    model_dir: str | None = None,
) -> GenerationRequest:
    """Check ``request`` against the deployment and the model; return it with a concrete
    seed, its unset steps/guidance filled from ``defaults`` (and the stage's cache
    threshold when it gave none). ``stage`` supplies cache and defaults when they are
    not given, and the LoRA rules (with ``model_dir``)."""
    if stage is not None:
        cache = cache if cache is not None else stage.cache
        defaults = defaults if defaults is not None else stage.request_defaults
    request = fill_defaults(request, defaults, capabilities)
    if capabilities is not None:
        request = admit_edit(request, capabilities)
    request = check_loras(request, capabilities, stage, model_dir)
    check_limits(request, server)
    if capabilities is not None:
        capabilities.check(request)
    if cache is not None:
        request = check_cache(request, cache)
    return request.with_seed()
