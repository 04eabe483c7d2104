"""The FLUX pipeline's LoRA adapters: the shared ``LoraAdapters``
(``models/lora_adapters.py``) with FLUX's file reader, which maps diffusers' module
names onto the native fused layers (``lora_file.py``), and admission's check of a
request's adapters against a FLUX model.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from diffserve.config.schema import StageConfig
from diffserve.models.flux.lora_file import (
    LoraAdapter,
    native_linear_shapes,
    read_flux_lora,
)
from diffserve.models.flux.params import FluxParams
from diffserve.models.loader import read_config
from diffserve.models.lora_adapters import LoraAdapters, check_adapters


def flux_lora_adapters(
    transformer: torch.nn.Module, params: FluxParams, stage: StageConfig
) -> LoraAdapters:
    """The adapters of a native FLUX transformer."""

    def reader(
        path: str,
        shapes: dict[str, tuple[int, int]],
        name: str,
        max_rank: int,
        dtype: torch.dtype,
    ) -> LoraAdapter:
        return read_flux_lora(
            path, params, shapes, name=name, max_rank=max_rank, dtype=dtype
        )

    return LoraAdapters(transformer, stage, reader)


def check_lora_request(
    loras: tuple[tuple[str, float], ...], stage: StageConfig, model_dir: str | Path
) -> tuple[tuple[str, float], ...]:
    """Admission's check of a request's adapters against a FLUX deployment
    (``check_adapters``)."""
    return check_adapters(loras, stage, model_dir, _check_file)


def _check_file(path: str, model_dir: str, max_rank: int) -> None:
    """The file fits the model: keys, shapes, rank."""
    params = FluxParams.from_diffusers_config(
        read_config(Path(model_dir) / "transformer")
    )
    shapes = native_linear_shapes(Path(model_dir) / "transformer", params)
    read_flux_lora(path, params, shapes, name=os.path.basename(path), max_rank=max_rank)
