"""A Wan stage built as the stage says: each expert's transformer on the stage's kernels
(sharded for Ulysses), UMT5, the video VAE and the model's own scheduler; keys Wan does
not run yet are refused, never ignored."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffserve.config.schema import StageConfig
from diffserve.errors import ConfigError, ModelLoadError
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext, ParallelContext
from diffserve.models.loader import read_config
from diffserve.models.memory import component_weights
from diffserve.models.runner import check_ulysses_heads
from diffserve.models.stage_kernels import stage_kernels
from diffserve.models.stepcache.teacache import stage_polynomial
from diffserve.models.wan.experts import Experts
from diffserve.models.wan.text import UMT5Text
from diffserve.models.wan.transformer import load_wan_transformer
from diffserve.models.wan.video import WanVae
from diffserve.registry.edits import needs_image
from diffserve.registry.models import (
    MODEL_FAMILIES,
    denoiser_components,
    read_class_name,
)
from diffserve.registry.teacache import TeaCachePolynomial, polynomial_for
from diffserve.types.memory import ComponentWeights, describe_weights

logger = get_logger(__name__)

# Stage keys the Wan pipeline does not run yet, with the value that does: refused at
# load, never ignored.
UNSUPPORTED = (
    ("quantization", "none"),
    ("text_encoder_quantization", "none"),
    ("offload", "none"),
)


def refuse_unsupported(stage: StageConfig) -> None:
    for key, supported in UNSUPPORTED:
        value: Any = getattr(stage, key)
        if value != supported:
            raise ConfigError(
                f"{key}={value!r} is not supported on Wan yet",
                path=f"stages.{stage.stage_id}.{key}",
                hint=f"set {key}: {supported} (quantization and offload run on FLUX)",
            )


@dataclass
class WanComponents:
    """Everything ``WanVideoPipeline`` runs with, loaded as the stage says."""

    experts: Experts
    text: UMT5Text
    vae: WanVae
    scheduler_config: dict[str, Any]
    family: str
    device: torch.device
    dtype: torch.dtype
    stage: StageConfig
    parallel: ParallelContext
    teacache: TeaCachePolynomial | None
    weights: dict[str, ComponentWeights]


def load_wan(root: Path, stage: StageConfig, context: BuildContext) -> WanComponents:
    """Every component of ``root`` as ``stage`` says."""
    from diffusers import AutoencoderKLWan

    from diffserve.models.loader import strict_from_pretrained

    family = read_class_name(root)
    refuse_unsupported(stage)
    index = json.loads((root / "model_index.json").read_text())
    names = denoiser_components(index)
    fit = polynomial_for(family, read_config(root / "transformer"), len(names))
    teacache = stage_polynomial(
        stage.cache, "wan", stage.stage_id, fit[0] if fit else None
    )
    start = time.perf_counter()
    device, dtype, kernels = stage_kernels(
        stage, context, MODEL_FAMILIES[family].attention_roles
    )
    transformers = {
        name: load_wan_transformer(root / name, kernels, dtype=dtype, device=device)
        for name in names
    }
    parallel = context.parallel
    if parallel.ulysses_size > 1:
        check_ulysses_heads(
            next(iter(transformers.values())).params.num_heads, parallel, stage.stage_id
        )
        for transformer in transformers.values():
            transformer.shard_sequence(
                parallel.ulysses_group, parallel.ulysses_rank, parallel.ulysses_size
            )
    experts = Experts(transformers, index.get("boundary_ratio"))
    text = UMT5Text(root, dtype=dtype, device=device, per_prompt=stage.batch_invariant)
    try:
        vae = (
            strict_from_pretrained(AutoencoderKLWan, root / "vae", dtype=dtype)
            .to(device)
            .eval()
        )
        scheduler_config = json.loads(
            (root / "scheduler" / "scheduler_config.json").read_text()
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"cannot load the VAE or scheduler of {root}: {exc}"
        ) from exc
    image_to_video = needs_image(MODEL_FAMILIES[family].features.edits)
    if image_to_video != (experts.params.in_channels > 16):
        raise ModelLoadError(
            f"{root}: a {family} whose transformer takes {experts.params.in_channels} "
            "channels "
            "(text-to-video takes 16, Wan2.2 image-to-video 36)"
        )
    weights = {
        **{
            name: component_weights(name, module)
            for name, module in transformers.items()
        },
        "text_encoder": component_weights("text_encoder", text.encoder),
        "vae": component_weights("vae", vae),
    }
    logger.info(
        "loaded %s (%s on %s) in %.1fs; weights: %s",
        root,
        dtype,
        device,
        time.perf_counter() - start,
        describe_weights(weights),
    )
    return WanComponents(
        experts,
        text,
        WanVae(vae),
        scheduler_config,
        family,
        device,
        dtype,
        stage,
        parallel,
        teacache,
        weights,
    )
