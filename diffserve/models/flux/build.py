"""A FLUX stage built as the stage says: the transformer loaded (a single file or GGUF
if it names one), quantized (``quantization`` minus ``quantization_ignored_layers``),
sharded for Ulysses and compiled unless ``enforce_eager``, its kernels chosen once; then
the text encoders, VAE, scheduler, adapters and offload."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffserve.config.schema import StageConfig
from diffserve.errors import ModelLoadError
from diffserve.layers.linear.quantized import (
    QuantizationResult,
    quantize_linears,
    warn_if_eager,
)
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext, ParallelContext, PipelineCapabilities
from diffserve.models.compile_options import compile_options
from diffserve.models.flux import edits
from diffserve.models.flux.cached_encoding import CachedTextEncoders
from diffserve.models.flux.encoders import TextEncoders
from diffserve.models.flux.lora import flux_lora_adapters
from diffserve.models.flux.sampling import check_scheduler_config
from diffserve.models.flux.stage_payloads import PayloadText
from diffserve.models.flux.transformer import FluxTransformer, load_flux_transformer
from diffserve.models.lora_adapters import LoraAdapters
from diffserve.models.memory import component_weights
from diffserve.models.offload import offload_native
from diffserve.models.runner import check_ulysses_heads
from diffserve.models.stage_kernels import stage_kernels
from diffserve.models.stepcache.teacache import stage_polynomial
from diffserve.models.vae_file import load_vae
from diffserve.models.vae_tiling import configure_tiling
from diffserve.registry.models import (
    FLUX_FEATURES,
    MODEL_FAMILIES,
    ModelFamily,
    read_class_name,
)
from diffserve.types.memory import ComponentWeights, describe_weights

logger = get_logger(__name__)

# TeaCache's only FLUX polynomial (registry/teacache.py), for every FLUX checkpoint
FLUX_FIT = "flux.1-dev"


def build_transformer(
    root: Path, stage: StageConfig, context: BuildContext
) -> tuple[FluxTransformer, QuantizationResult, torch.device, torch.dtype]:
    """The stage's transformer, what its quantization did, and the device and dtype it
    runs in."""
    roles = MODEL_FAMILIES["FluxPipeline"].attention_roles
    device, dtype, kernels = stage_kernels(stage, context, roles)
    transformer = load_flux_transformer(
        root / "transformer",
        kernels,
        dtype=dtype,
        device=device,
        weights_file=stage.components.get("transformer"),
    )
    if fuses_single_blocks(stage, device):
        transformer.fuse_single_blocks()
    ignored = stage.quantization_ignored_layers
    if device.type == "cuda":
        ignored += FLUX_FEATURES.gpu_quantization_ignored_layers
    quantized = quantize_linears(transformer, stage.quantization, ignored)
    warn_if_eager(stage.quantization, stage.enforce_eager, device)
    if context.parallel.ulysses_size > 1:
        check_ulysses_heads(
            transformer.params.num_heads, context.parallel, stage.stage_id
        )
        transformer.shard_sequence(
            context.parallel.ulysses_group, kernels.counters.collectives
        )
    if not stage.enforce_eager:
        options = compile_options(device, stage.cuda_graphs)
        transformer.compile_blocks(options.mode, options.dynamic)
    return transformer, quantized, device, dtype


def fuses_single_blocks(stage: StageConfig, device: torch.device) -> bool:
    """Whether the single blocks run merged projections
    (``SingleStreamBlock.fuse_projections``): on a GPU, where one wider GEMM and no
    concatenation pay; not on a CPU, where oneDNN fuses ``mlp_in``'s GELU into its own
    GEMM; not with LoRA adapters (their files name the unmerged layers) or a GGUF
    transformer (its packed weights are per layer)."""
    return (
        device.type == "cuda"
        and not stage.lora_modules
        and not stage.lora_dir
        and not stage.components.get("transformer", "").endswith(".gguf")
    )


@dataclass
class FluxComponents:
    """Everything ``FluxPipeline`` runs with, loaded and configured as the stage
    says."""

    transformer: FluxTransformer
    # None: another stage encodes (the text comes as payloads)
    encoders: TextEncoders | None
    text: CachedTextEncoders | PayloadText
    vae: Any
    scheduler_config: dict[str, Any]
    device: torch.device
    dtype: torch.dtype
    family: ModelFamily
    stage: StageConfig
    parallel: ParallelContext
    decoded_elsewhere: bool
    loras: LoraAdapters | None
    weights: dict[str, ComponentWeights]
    # What the family edits (registry): FLUX.1 from the image itself, FLUX.1 Kontext
    # from a reference image whose latents ride along as extra tokens.
    editor: edits.EditPreparer | edits.ReferencePreparer

    @property
    def vae_scale_factor(self) -> int:
        return int(2 ** (len(self.vae.config.block_out_channels) - 1))


def load_flux(root: Path, stage: StageConfig, context: BuildContext) -> FluxComponents:
    """Every component of ``root`` as ``stage`` says (a component's weights from a
    single file when ``stage.components`` names it)."""
    if not (root / "transformer").is_dir():
        raise ModelLoadError(
            f"{root} is not a FLUX model directory (no transformer/ folder)"
        )
    # Refused before anything loads.
    stage_polynomial(stage.cache, "flux", stage.stage_id, FLUX_FIT)
    start = time.perf_counter()
    transformer, quantized, device, dtype = build_transformer(root, stage, context)
    encoders = (
        None
        if context.encoded_elsewhere
        else TextEncoders(
            root,
            dtype=dtype,
            device=device,
            per_prompt=stage.batch_invariant,
            weights_files=stage.components,
        )
    )
    encoders_quantized = (
        encoders.quantize(stage.text_encoder_quantization)
        if encoders is not None
        else {}
    )
    encoder_modules = encoders.modules() if encoders is not None else {}
    vae = load_vae(
        root / "vae",
        dtype=dtype,
        device=device,
        weights_file=stage.components.get("vae"),
    )
    try:
        scheduler_config = json.loads(
            (root / "scheduler" / "scheduler_config.json").read_text()
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot read the scheduler config of {root}: {exc}"
        ) from exc
    check_scheduler_config(scheduler_config)
    configure_tiling(vae, stage.vae)
    logger.info(
        "loaded %s (%s on %s) in %.1fs",
        root,
        dtype,
        device,
        time.perf_counter() - start,
    )
    text = (
        PayloadText(
            transformer.params,
            stage_id=stage.stage_id,
            role=stage.role,
            device=device,
            dtype=dtype,
        )
        if encoders is None
        else CachedTextEncoders.for_model(
            encoders,
            root,
            stage.conditioning_cache,
            dict(stage.components),
            str(dtype),
            stage.text_encoder_quantization,
            stage.batch_invariant,
        )
    )
    loras = transformer.lora_adapters = flux_lora_adapters(
        transformer, transformer.params, stage
    )
    offload_native(
        stage.offload,
        denoiser_blocks=[*transformer.double_blocks, *transformer.single_blocks],
        components={**encoder_modules, "vae": vae},
        device=device,
    )
    weights = {
        "transformer": component_weights(
            "transformer", transformer, quantization=quantized.attested()
        ),
        **{
            name: component_weights(
                name, module, quantization=encoders_quantized[name].attested()
            )
            for name, module in encoder_modules.items()
        },
        "vae": component_weights("vae", vae),
    }
    logger.info("weights: %s", describe_weights(weights))
    family = MODEL_FAMILIES[read_class_name(root)]
    preparer = (
        edits.ReferencePreparer
        if "reference" in family.features.edits
        else edits.EditPreparer
    )
    editor = preparer(
        vae, transformer.params.in_channels // 4, dtype=dtype, device=device
    )
    return FluxComponents(
        transformer,
        encoders,
        text,
        vae,
        scheduler_config,
        device,
        dtype,
        family,
        stage,
        context.parallel,
        context.decoded_elsewhere,
        loras,
        weights,
        editor,
    )


def flux_capabilities(parts: FluxComponents) -> PipelineCapabilities:
    """What the loaded FLUX stage serves (admission checks every request against it)."""
    family, parallel = parts.family, parts.parallel
    return PipelineCapabilities(
        family=family.class_name,
        default_size=int(parts.vae.config.sample_size),
        # Ulysses shards the image tokens ((H/16) * (W/16)) evenly: a side that is a
        # multiple of 16 * degree guarantees it, and admission then refuses any other
        # size before a rank sees it.
        size_multiple=2 * parts.vae_scale_factor * parallel.ulysses_size,
        max_sequence_length=family.defaults.max_sequence_length,
        true_cfg=True,
        attention_roles=family.attention_roles,
        # Joins need every rank to agree on the step a request joins at: one rank
        # only, for now.
        step_batching=parallel.world_size == 1,
        token_pixels=2 * parts.vae_scale_factor,
        lora=family.features.lora_check is not None,
        edits=family.features.edits if parallel.world_size == 1 else (),
        # Per-sample transformer calls and per-prompt encoding; the VAE decodes one
        # image at a time.
        batch_invariant=parts.transformer.kernels.batch_invariant
        and (parts.encoders is None or parts.encoders.per_prompt),
        default_cache_threshold=parts.stage.cache.request_threshold,
        # The VAE is here to decode previews, unless a decoding stage holds it.
        partial_images=not parts.decoded_elsewhere,
    )
