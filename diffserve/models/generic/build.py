"""A generic family's stage built as the stage says: diffusers' own pipeline class
loaded strictly (safetensors, no hub), its denoiser's Linear and attention calls moved
onto the stage's kernels, quantized, offloaded, adapters and the step cache attached,
compiled unless ``enforce_eager``. Runs on the pipeline's compute thread."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffserve.config.schema import StageConfig
from diffserve.errors import ModelLoadError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.kernels import build_kernel_set
from diffserve.layers.linear.quantized import quantize_linears
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext
from diffserve.models.compile_options import compile_options
from diffserve.models.dtype import resolve_dtype
from diffserve.models.generic.compile import compile_denoiser, count_forwards
from diffserve.models.generic.kernels import (
    check_masked_roles,
    route_attention,
    swap_linears,
)
from diffserve.models.generic.lora import generic_lora_adapters
from diffserve.models.generic.step_cache import GenericStepCache
from diffserve.models.generic.vl_processor import init_components, processor_components
from diffserve.models.loader import strict_model_components
from diffserve.models.memory import component_weights
from diffserve.models.offload import offload_diffusers
from diffserve.registry.models import MODEL_FAMILIES, ModelFamily, read_class_name
from diffserve.types.memory import ComponentWeights, describe_weights

logger = get_logger(__name__)


@dataclass
class GenericParts:
    """What ``GenericPipeline`` runs with."""

    pipe: Any
    family: ModelFamily
    counters: KernelCounters
    device: torch.device
    dtype: torch.dtype
    roles: dict[str, str]
    step_cache: GenericStepCache | None
    loras: Any
    weights: dict[str, ComponentWeights]


def load_generic(root: Path, stage: StageConfig, context: BuildContext) -> GenericParts:
    """Load ``root`` with diffusers and put its denoiser on the stage's kernels."""
    import diffusers

    class_name = read_class_name(root)
    family = MODEL_FAMILIES[class_name]
    device = torch.device(context.device)
    dtype = resolve_dtype(stage.dtype, device)
    start = time.perf_counter()
    kernels = build_kernel_set(
        stage.linear_backend,
        stage.attention_backend,
        roles=family.attention_roles,
        device=device,
        dtype=dtype,
        observers=context.kernel_observers,
        batch_invariant=stage.batch_invariant,
    )
    check_masked_roles(kernels, family.generic.masked_roles, stage.stage_id)
    try:
        pipeline_class = getattr(diffusers, class_name)
        components = strict_model_components(root, dtype)
        # Processors transformers cannot build here go in after the load (diffusers
        # would check their class against one that does not exist without
        # torchvision).
        processors = processor_components(root)
        pipe = pipeline_class.from_pretrained(
            str(root),
            torch_dtype=dtype,
            use_safetensors=True,
            local_files_only=True,
            **components,
            **init_components(root),
            **dict.fromkeys(processors),
        )
        pipe.register_modules(**processors)
    except (OSError, ValueError, AttributeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(
            f"cannot load {class_name} from {root} with diffusers: {exc}"
        ) from exc
    pipe.set_progress_bar_config(disable=True)
    denoiser = getattr(pipe, family.denoiser)
    ensure_dtype(denoiser, dtype)
    linears = swap_linears(denoiser, kernels)
    roles = route_attention(denoiser, kernels, family.generic.role_patterns)
    pipe.to(device)
    weights = quantized_weights(pipe, family.denoiser, stage)
    offload_diffusers(stage.offload, pipe, device)
    # LoRA finds its layers by their diffusers names: before the step cache wraps
    # the blocks.
    loras = (
        generic_lora_adapters(denoiser, stage)
        if family.features.lora_check is not None
        else None
    )
    step_cache = None
    # Config refuses the rest.
    if (
        stage.cache.backend == "fbcache"
        and family.generic.first_block_cache is not None
    ):
        step_cache = GenericStepCache(denoiser, family.generic.first_block_cache)
    count_forwards(
        denoiser,
        kernels.counters,
        step_cache.forward_computed if step_cache else lambda: True,
    )
    if not stage.enforce_eager:
        compile_denoiser(
            denoiser, kernels.counters, compile_options(device, stage.cuda_graphs)
        )
    logger.info(
        "loaded %s on the generic path (%s on %s, %d Linear "
        "and %d attention modules on %s) in %.1fs",
        class_name,
        dtype,
        device,
        linears,
        len(roles),
        kernels.describe(),
        time.perf_counter() - start,
    )
    logger.info("weights: %s", describe_weights(weights))
    return GenericParts(
        pipe, family, kernels.counters, device, dtype, roles, step_cache, loras, weights
    )


def quantized_weights(
    pipe: Any, denoiser: str, stage: StageConfig
) -> dict[str, ComponentWeights]:
    """Quantize the denoiser (``quantization``, minus ``quantization_ignored_layers``)
    and the text encoders (``text_encoder_quantization``), then report every network
    component's weights."""
    weights = {}
    for name, module in pipe.components.items():
        if not isinstance(module, torch.nn.Module):
            continue  # tokenizers, the scheduler
        quantized = None
        if name == denoiser:
            quantized = quantize_linears(
                module, stage.quantization, stage.quantization_ignored_layers
            ).attested()
        elif name.startswith("text_encoder"):
            quantized = quantize_linears(
                module, stage.text_encoder_quantization
            ).attested()
        weights[name] = component_weights(name, module, quantization=quantized)
    return weights


def ensure_dtype(denoiser: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast the denoiser to ``dtype`` where diffusers left it elsewhere. Without
    ``accelerate``, diffusers 0.42 loads a checkpoint that stores a buffer (SD3's
    ``pos_embed.pos_embed``) in float32 whatever ``torch_dtype`` says; the deployment
    asked for ``dtype`` and the attestation reports it. Modules a class keeps in float32
    on purpose (``_keep_in_fp32_modules``) are left to diffusers."""
    if getattr(denoiser, "_keep_in_fp32_modules", None):
        return
    if any(p.dtype != dtype for p in denoiser.parameters() if p.is_floating_point()):
        logger.info(
            "casting %s to %s (diffusers loaded it as %s)",
            type(denoiser).__name__,
            dtype,
            next(denoiser.parameters()).dtype,
        )
        denoiser.to(dtype)
