"""Per-request LoRA on the generic path: adapters in the diffusers/PEFT layout (what a
pipeline's ``load_lora_weights`` reads: ``[transformer.]<module>.lora_A.weight`` ``[r,
in]`` and ``.lora_B.weight`` ``[out, r]``, scaling ``lora_alpha / r`` from the file's
``lora_adapter_metadata``, else 1), applied unmerged through our ``Linear``
(``layers/linear/lora.py``) of the diffusers denoiser, whose module names are the file's
own: no name mapping, unlike native FLUX's fused layers. Batched by adapter set, as on
the native path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from diffserve.config.schema import StageConfig
from diffserve.errors import LoraError
from diffserve.models.lora_adapters import (
    LoraAdapter,
    LoraAdapters,
    check_adapters,
    peft_scaling,
    read_lora_tensors,
)

_PEFT = re.compile(
    r"^(?:transformer\.)?(?P<module>.+)\.lora_(?P<part>A|B)(?:\.default)?\.weight$"
)


def read_peft_lora(
    path: str,
    shapes: dict[str, tuple[int, int]],
    name: str,
    max_rank: int,
    dtype: torch.dtype = torch.float32,
) -> LoraAdapter:
    """The adapter's factors per denoiser ``Linear`` (scaling folded into B);
    ``LoraError`` when a key targets no layer of ``shapes`` (``(out, in)`` by module
    name), a pair is incomplete or misshapen, or a rank is above ``max_rank``."""
    tensors, metadata = read_lora_tensors(Path(path))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    unmatched = []
    for key, tensor in tensors.items():
        match = _PEFT.match(key)
        if match is None or match["module"] not in shapes:
            unmatched.append(key)
            continue
        pairs.setdefault(match["module"], {})[match["part"]] = tensor
    if unmatched:
        raise LoraError(
            f"{path}: {len(unmatched)} key(s) match no Linear of "
            "this model's denoiser, e.g. "
            f"{', '.join(sorted(unmatched)[:3])}",
            hint="use a LoRA in the diffusers/PEFT layout (lora_A/lora_B) "
            "made for this model family",
        )
    if not pairs:
        raise LoraError(
            f"{path}: no LoRA weights in the file", hint="pass a LoRA .safetensors file"
        )
    scaling = peft_scaling(metadata) or 1.0
    layers = {}
    for module, pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise LoraError(
                f"{path}: {module} has {''.join(pair)} without its pair",
                hint="every lora_A needs its lora_B",
            )
        a, b = pair["A"].float(), pair["B"].float()
        out_features, in_features = shapes[module]
        if (
            a.ndim != 2
            or b.ndim != 2
            or a.shape[1] != in_features
            or b.shape != (out_features, a.shape[0])
        ):
            raise LoraError(
                f"{path}: {module}: A {tuple(a.shape)} / B {tuple(b.shape)} "
                "do not fit the layer "
                f"({out_features} x {in_features})",
                hint="the adapter was made for another model",
            )
        if a.shape[0] > max_rank:
            raise LoraError(
                f"{path}: {module} has rank {a.shape[0]}, above max_lora_rank "
                f"{max_rank}",
                hint="raise max_lora_rank in the deploy config",
            )
        layers[module] = (a.to(dtype), (b * scaling).to(dtype))
    return LoraAdapter(name=name, path=str(path), layers=layers)


def generic_lora_adapters(
    denoiser: torch.nn.Module, stage: StageConfig
) -> LoraAdapters:
    """The adapters of a diffusers denoiser on our kernels (build it before anything
    wraps its blocks: the layers are found by their diffusers names)."""
    return LoraAdapters(denoiser, stage, read_peft_lora)


def check_lora_request(
    loras: tuple[tuple[str, float], ...], stage: StageConfig, model_dir: str | Path
) -> tuple[tuple[str, float], ...]:
    """Admission's check of a request's adapters against a generic deployment
    (``check_adapters``)."""
    return check_adapters(loras, stage, model_dir, _check_file)


def _check_file(path: str, model_dir: str, max_rank: int) -> None:
    read_peft_lora(
        path,
        denoiser_linear_shapes(Path(model_dir) / "transformer"),
        os.path.basename(path),
        max_rank,
    )


def denoiser_linear_shapes(denoiser_dir: Path) -> dict[str, tuple[int, int]]:
    """``(out, in)`` of every 2-D ``<module>.weight`` in the checkpoint's headers (no
    tensor is read)."""
    from safetensors import safe_open

    shapes = {}
    for file in sorted(denoiser_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open handles are not mappings
                shape = handle.get_slice(key).get_shape()
                if key.endswith(".weight") and len(shape) == 2:
                    shapes[key.removesuffix(".weight")] = (int(shape[0]), int(shape[1]))
    return shapes
