"""A FLUX stage built as the stage says: the transformer loaded (a single file or GGUF if it names one),
quantized (``quantization`` minus ``quantization_ignored_layers``), sharded for Ulysses and compiled unless
``enforce_eager``, its kernels chosen once; then the text encoders, VAE, scheduler, adapters and offload."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from diffserve.config.schema import StageConfig
from diffserve.errors import ModelLoadError
from diffserve.layers.linear.quantized import QuantizationResult, quantize_linears
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext
from diffserve.models.flux.cached_encoding import CachedTextEncoders
from diffserve.models.flux.encoders import TextEncoders
from diffserve.models.flux.lora import flux_lora_adapters
from diffserve.models.flux.stage_payloads import PayloadText
from diffserve.models.flux.transformer import FluxTransformer, load_flux_transformer
from diffserve.models.memory import component_weights
from diffserve.models.offload import offload_native
from diffserve.models.runner import check_ulysses_heads
from diffserve.models.stage_kernels import stage_kernels
from diffserve.models.stepcache.teacache import stage_polynomial
from diffserve.models.vae_file import load_vae
from diffserve.registry.models import MODEL_FAMILIES, read_class_name
from diffserve.types.memory import describe_weights

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.models.flux.pipeline import FluxPipeline

logger = get_logger(__name__)

FLUX_FIT = "flux.1-dev"  # TeaCache's only FLUX polynomial (registry/teacache.py), for every FLUX checkpoint


def build_transformer(root: Path, stage: StageConfig,
                      context: BuildContext) -> tuple[FluxTransformer, QuantizationResult, torch.device, torch.dtype]:
    """The stage's transformer, what its quantization did, and the device and dtype it runs in."""
    roles = MODEL_FAMILIES["FluxPipeline"].attention_roles
    device, dtype, kernels = stage_kernels(stage, context, roles)
    transformer = load_flux_transformer(root / "transformer", kernels, dtype=dtype, device=device,
                                        weights_file=stage.components.get("transformer"))
    quantized = quantize_linears(transformer, stage.quantization, stage.quantization_ignored_layers)
    if context.parallel.ulysses_size > 1:
        check_ulysses_heads(transformer.params.num_heads, context.parallel, stage.stage_id)
        transformer.shard_sequence(context.parallel.ulysses_group, kernels.counters.collectives)
    if not stage.enforce_eager:
        transformer.compile_blocks()
    return transformer, quantized, device, dtype


def load_flux(cls: type[FluxPipeline], root: Path, stage: StageConfig, context: BuildContext) -> FluxPipeline:
    """``FluxPipeline.from_stage``: every component of ``root`` as ``stage`` says."""
    if not (root / "transformer").is_dir():
        raise ModelLoadError(f"{root} is not a FLUX model directory (no transformer/ folder)")
    stage_polynomial(stage.cache, "flux", stage.stage_id, FLUX_FIT)  # refused before anything loads
    start = time.perf_counter()
    transformer, quantized, device, dtype = build_transformer(root, stage, context)
    encoders = None if context.encoded_elsewhere else TextEncoders(
        root, dtype=dtype, device=device, per_prompt=stage.batch_invariant, weights_files=stage.components)
    encoders_quantized = encoders.quantize(stage.text_encoder_quantization) if encoders is not None else {}
    encoder_modules = encoders.modules() if encoders is not None else {}
    vae = load_vae(root / "vae", dtype=dtype, device=device, weights_file=stage.components.get("vae"))
    try:
        scheduler_config = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the scheduler config of {root}: {exc}") from exc
    logger.info("loaded %s (%s on %s) in %.1fs", root, dtype, device, time.perf_counter() - start)
    pipeline = cls(transformer, encoders, vae, scheduler_config, device=device, dtype=dtype,
                   parallel=context.parallel, cache=stage.cache, family=MODEL_FAMILIES[read_class_name(root)],
                   vae_config=stage.vae)
    pipeline.loras = transformer.lora_adapters = flux_lora_adapters(transformer, transformer.params, stage)
    pipeline.stage_id, pipeline.decoded_elsewhere = stage.stage_id, context.decoded_elsewhere
    pipeline.text = PayloadText(transformer.params, stage_id=stage.stage_id, role=stage.role, device=device,
                                dtype=dtype) if encoders is None else CachedTextEncoders.for_model(
        encoders, root, stage.conditioning_cache, dict(stage.components), str(dtype),
        stage.text_encoder_quantization, stage.batch_invariant)
    offload_native(stage.offload, denoiser_blocks=[*transformer.double_blocks, *transformer.single_blocks],
                   components={**encoder_modules, "vae": vae}, device=device)
    pipeline.weights = {
        "transformer": component_weights("transformer", transformer, quantization=quantized.attested()),
        **{name: component_weights(name, module, quantization=encoders_quantized[name].attested())
           for name, module in encoder_modules.items()},
        "vae": component_weights("vae", vae)}
    logger.info("weights: %s", describe_weights(pipeline.weights))
    return pipeline
