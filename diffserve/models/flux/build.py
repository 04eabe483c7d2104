"""The FLUX transformer of a stage, built as the stage says: loaded (a single file or GGUF if it names one),
quantized (``quantization`` minus ``quantization_ignored_layers``), sharded for Ulysses and compiled unless
``enforce_eager``; its kernels chosen once."""

from __future__ import annotations

from pathlib import Path

import torch

from diffserve.config.schema import StageConfig
from diffserve.errors import ConfigError
from diffserve.layers.linear.quantized import QuantizationResult, quantize_linears
from diffserve.models.base import BuildContext
from diffserve.models.flux.transformer import FluxTransformer, load_flux_transformer
from diffserve.models.stage_kernels import stage_kernels
from diffserve.registry.models import MODEL_FAMILIES


def build_transformer(root: Path, stage: StageConfig,
                      context: BuildContext) -> tuple[FluxTransformer, QuantizationResult, torch.device, torch.dtype]:
    """The stage's transformer, what its quantization did, and the device and dtype it runs in."""
    roles = MODEL_FAMILIES["FluxPipeline"].attention_roles
    device, dtype, kernels = stage_kernels(stage, context, roles)
    transformer = load_flux_transformer(root / "transformer", kernels, dtype=dtype, device=device,
                                        weights_file=stage.components.get("transformer"))
    quantized = quantize_linears(transformer, stage.quantization, stage.quantization_ignored_layers)
    ulysses = context.parallel.ulysses_size
    if ulysses > 1:
        heads = transformer.params.num_heads
        if heads % ulysses:
            allowed = ", ".join(str(u) for u in range(1, heads + 1) if heads % u == 0)
            raise ConfigError(f"ulysses_degree {ulysses} must divide the transformer's {heads} attention heads",
                              path=f"stages.{stage.stage_id}.parallel.ulysses_degree", hint=f"use one of {allowed}")
        transformer.shard_sequence(context.parallel.ulysses_group, kernels.counters.collectives)
    if not stage.enforce_eager:
        transformer.compile_blocks()
    return transformer, quantized, device, dtype
