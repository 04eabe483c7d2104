"""Build a native FLUX transformer the way the pipeline does (kernel set from a
stage-shaped choice)."""

from __future__ import annotations

import torch

from diffserve.config.schema import FrozenDict
from diffserve.config.stage_sections import AttentionBackendConfig
from diffserve.layers.kernels import build_kernel_set
from diffserve.models.flux.transformer import FluxTransformer, load_flux_transformer
from diffserve.registry.models import MODEL_FAMILIES


def flux_transformer(
    path, linear: str = "torch", attention: str | dict[str, str] = "sdpa"
) -> FluxTransformer:
    """``attention`` is a name or ``{"default": name, role: name}`` as in a deploy
    file."""
    if isinstance(attention, dict):
        roles = {k: v for k, v in attention.items() if k != "default"}
        choice = AttentionBackendConfig(
            attention.get("default", "auto"), FrozenDict(roles)
        )
    else:
        choice = AttentionBackendConfig(attention)
    kernels = build_kernel_set(
        linear,
        choice,
        roles=MODEL_FAMILIES["FluxPipeline"].attention_roles,
        device="cpu",
        dtype=torch.float32,
    )
    return load_flux_transformer(path, kernels)
