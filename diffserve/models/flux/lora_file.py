"""FLUX LoRA files -> low-rank deltas on the native transformer's ``Linear`` layers.

Two key layouts are read (safetensors only):
- diffusers/PEFT, what ``FluxPipeline.load_lora_weights`` accepts:
  ``[transformer.]<diffusers module>.lora_A.weight``
  ``[r, in]`` and ``.lora_B.weight`` ``[out, r]``, scaling ``lora_alpha / r`` from the
  file's ``lora_adapter_metadata`` when present, else 1 (as diffusers does for such
  files);
- kohya/BFL: ``lora_unet_<native module, dots as underscores>.lora_down.weight`` /
  ``.lora_up.weight`` and
  ``.alpha`` (scaling ``alpha / r``); its module names are the native ones (BFL's
  reference naming).

The native transformer fuses diffusers' separate projections (Q/K/V into ``qkv``;
``models/flux/weights.py``), so the deltas of the parts are stacked: ``A`` rows
concatenated, ``B`` block-placed at each part's output rows. The scaling is folded into
``B``. A LoRA delta is then ``(x @ A.T) @ B.T`` per native layer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from diffserve.errors import LoraError
from diffserve.models.flux.params import FluxParams
from diffserve.models.flux.weights import _swap_halves, conversion_rules
from diffserve.models.lora_adapters import LoraAdapter, peft_scaling, read_lora_tensors

_PEFT = re.compile(
    r"^(?:transformer\.)?(?P<module>.+)\.lora_(?P<part>A|B)(?:\.default)?\.weight$"
)
_KOHYA = re.compile(
    r"^lora_unet_(?P<module>.+)\.(?P<part>lora_down\.weight|lora_up\.weight|alpha)$"
)


def native_linear_shapes(
    transformer_dir: str | Path, params: FluxParams
) -> dict[str, tuple[int, int]]:
    """``(out, in)`` of every native ``Linear`` from the checkpoint's headers (no tensor
    is read)."""
    from safetensors import safe_open

    directory = Path(transformer_dir)
    files = sorted(directory.glob("*.safetensors"))
    shapes: dict[str, list[int]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open handles are not mappings
                shapes[key] = list(handle.get_slice(key).get_shape())
    out: dict[str, tuple[int, int]] = {}
    for native, (sources, _) in conversion_rules(params).items():
        if native.endswith(".weight") and len(shapes.get(sources[0], ())) == 2:
            out[native.removesuffix(".weight")] = (
                sum(shapes[s][0] for s in sources),
                shapes[sources[0]][1],
            )
    return out


def read_flux_lora(
    path: str | Path,
    params: FluxParams,
    shapes: Mapping[str, tuple[int, int]],
    *,
    name: str,
    max_rank: int,
    dtype: torch.dtype = torch.float32,
) -> LoraAdapter:
    """Read and check one LoRA file against the model; ``LoraError`` says what is wrong
    and how to fix it."""
    tensors, metadata = read_lora_tensors(Path(path))
    parts = _diffusers_parts(params)
    kohya_names = {native.replace(".", "_"): native for native in shapes}
    # Native -> part index -> {"A", "B", "alpha"}.
    found: dict[str, dict[int, dict[str, Tensor]]] = {}
    unmatched = []
    for key, tensor in tensors.items():
        if match := _PEFT.match(key):
            target = parts.get(match["module"])
            kind = match["part"]
        elif match := _KOHYA.match(key):
            native = kohya_names.get(match["module"])
            target = (native, 0, 1) if native else None
            kind = {"lora_down.weight": "A", "lora_up.weight": "B", "alpha": "alpha"}[
                match["part"]
            ]
        else:
            target = None
        if target is None:
            unmatched.append(key)
            continue
        native, index, _ = target
        found.setdefault(native, {}).setdefault(index, {})[kind] = tensor
    if unmatched:
        raise LoraError(
            f"{path}: {len(unmatched)} key(s) match no layer of this FLUX model, e.g. "
            f"{', '.join(sorted(unmatched)[:3])}",
            hint="use a FLUX LoRA in the diffusers/PEFT (lora_A/lora_B) "
            "or kohya (lora_unet_*) layout "
            "made for a model of this architecture",
        )
    if not found:
        raise LoraError(
            f"{path}: no LoRA weights in the file", hint="pass a LoRA .safetensors file"
        )
    scaling = peft_scaling(metadata)
    layers = {
        native: _fuse(
            path, native, by_part, shapes[native], parts, scaling, max_rank, dtype
        )
        for native, by_part in found.items()
    }
    return LoraAdapter(name=name, path=str(path), layers=layers)


def _diffusers_parts(params: FluxParams) -> dict[str, tuple[str, int, int]]:
    """diffusers module -> (native layer, its part index, number of parts) for every
    native Linear."""
    out = {}
    for native, (sources, _) in conversion_rules(params).items():
        if native.endswith(".weight"):
            for index, source in enumerate(sources):
                out[source.removesuffix(".weight")] = (
                    native.removesuffix(".weight"),
                    index,
                    len(sources),
                )
    return out


def _fuse(
    path: str | Path,
    native: str,
    by_part: dict[int, dict[str, Tensor]],
    shape: tuple[int, int],
    parts: dict[str, tuple[str, int, int]],
    scaling: float | None,
    max_rank: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    out_features, in_features = shape
    count = next((n for layer, _, n in parts.values() if layer == native), 1)
    size = out_features // count
    a_rows, b_blocks = [], []
    for index in sorted(by_part):
        entry = by_part[index]
        if "A" not in entry or "B" not in entry:
            raise LoraError(
                f"{path}: {native} part {index} has {'A' if 'A' in entry else 'B'} "
                "without its pair",
                hint="every lora_A/lora_down needs its lora_B/lora_up",
            )
        a, b = entry["A"].float(), entry["B"].float()
        width = size if count > 1 else out_features
        if (
            a.ndim != 2
            or b.ndim != 2
            or a.shape[1] != in_features
            or b.shape[0] != width
            or b.shape[1] != a.shape[0]
        ):
            raise LoraError(
                f"{path}: {native}: A {tuple(a.shape)} / B {tuple(b.shape)} "
                "do not fit the layer "
                f"({width} x {in_features}) or each other (rank mismatch)",
                hint="the adapter was made for another model or is corrupt",
            )
        rank = a.shape[0]
        alpha = entry.get("alpha")
        factor = (
            float(alpha) / rank
            if alpha is not None
            else (scaling if scaling is not None else 1.0)
        )
        a_rows.append(a)
        b_blocks.append((index, b * factor))
    total = sum(a.shape[0] for a in a_rows)
    if total > max_rank:
        raise LoraError(
            f"{path}: {native} needs rank {total} (its parts together), "
            f"above max_lora_rank {max_rank}",
            hint=f"raise max_lora_rank to at least {total}",
        )
    b_full = torch.zeros(out_features, total)
    col = 0
    for index, b in b_blocks:
        rows = (
            slice(index * size, (index + 1) * size)
            if count > 1
            else slice(0, out_features)
        )
        b_full[rows, col : col + b.shape[1]] = b
        col += b.shape[1]
    if native == "final_layer.adaLN_modulation.1":
        # Diffusers' (scale, shift) rows -> the native (shift, scale)
        b_full = _swap_halves([b_full])
    return torch.cat(a_rows).to(dtype), b_full.to(dtype)
