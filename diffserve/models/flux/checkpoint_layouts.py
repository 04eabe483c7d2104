"""Single-file FLUX transformer checkpoints: which key layout a file has, and its
weights as the native module's.

Three layouts, told apart by their keys:

- ``diffusers``: ``transformer_blocks.N.attn.to_q.weight``, ... (a ``transformer/``
  folder's file, alone);
- ``bfl``: Black Forest Labs' reference names, ``double_blocks.N.img_attn.qkv.weight``,
  ... (``flux1-dev.safetensors``);
- ``comfyui``: BFL's names under ``model.diffusion_model.`` (ComfyUI's bundled
  checkpoints, which may also hold
  the VAE under ``first_stage_model.`` and text encoders under ``cond_stage_model.`` /
  ``text_encoders.``).

The native module keeps BFL's names (weights.py) except that a single block's fused
``linear1`` is split into its attention ``qkv`` and its ``mlp_in`` rows, and the MLPs'
second Linear is ``.1`` (not ``.2``): BFL's ``final_layer.adaLN_modulation`` is already
in the native (shift, scale) order, unlike diffusers'.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from diffserve.errors import ModelLoadError
from diffserve.layers.linear.gguf import QuantizedWeight
from diffserve.logging import get_logger
from diffserve.models.flux.params import FluxParams
from diffserve.models.flux.weights import (
    conversion_rules,
    convert_diffusers_state_dict,
    diffusers_key_names,
)
from diffserve.models.loader import check_key_match, looks_like

logger = get_logger(__name__)

COMFYUI_PREFIX = "model.diffusion_model."
_BFL_MLP = re.compile(r"^(double_blocks\.\d+\.(?:img|txt)_mlp)\.2\.(weight|bias)$")
_NATIVE_MLP = re.compile(r"^(double_blocks\.\d+\.(?:img|txt)_mlp)\.1\.(weight|bias)$")
_NATIVE_LINEAR1 = re.compile(r"^(single_blocks\.\d+)\.(qkv|mlp_in)\.(weight|bias)$")


def detect_layout(keys: Iterable[str], source: str) -> str:
    """``diffusers`` | ``bfl`` | ``comfyui``; anything else is a ModelLoadError saying
    what the keys look like."""
    names = list(keys)
    if any(k.startswith(COMFYUI_PREFIX + "double_blocks.") for k in names):
        return "comfyui"
    if any(k.startswith("double_blocks.") for k in names):
        return "bfl"
    if any(k.startswith("transformer_blocks.") and ".attn.to_q." in k for k in names):
        return "diffusers"
    raise ModelLoadError(
        f"{source}: {looks_like(names)}, expected a FLUX transformer "
        "(diffusers `transformer_blocks.N.attn."
        "to_q.weight`, BFL `double_blocks.N.img_attn.qkv.weight`, "
        "or ComfyUI `model.diffusion_"
        "model.double_blocks...`)"
    )


# What else a ComfyUI all-in-one checkpoint may hold: component -> its key prefix there.
COMFYUI_BUNDLED = {
    "vae": "first_stage_model.",
    "text_encoder": "text_encoders.clip_l.",
    "text_encoder_2": "text_encoders.t5xxl.",
}


def comfyui_transformer(state_dict: dict[str, Any], source: str = "") -> dict[str, Any]:
    """The transformer's tensors of a ComfyUI checkpoint, with BFL names (its bundled
    components dropped: each is read from the file only where the deployment names the
    file for it too)."""
    bundled = [
        name
        for name, prefix in COMFYUI_BUNDLED.items()
        if any(k.startswith(prefix) for k in state_dict)
    ]
    if bundled:
        flags = ", ".join(f"--{name.replace('_', '-')} FILE" for name in bundled)
        logger.info(
            "%s also holds %s: the transformer alone is read from "
            "it (name the file for them too, %s, "
            "to use them)",
            source or "the checkpoint",
            ", ".join(bundled),
            flags,
        )
    return {
        key[len(COMFYUI_PREFIX) :]: tensor
        for key, tensor in state_dict.items()
        if key.startswith(COMFYUI_PREFIX)
    }


def bfl_to_native(
    state_dict: dict[str, Any], params: FluxParams, source: str
) -> dict[str, Any]:
    """BFL names -> the native module's (consuming ``state_dict``)."""
    native: dict[str, Any] = {}
    qkv_rows = 3 * params.hidden_size
    for key in list(state_dict):
        tensor = state_dict.pop(key)
        mlp = _BFL_MLP.match(key)
        if mlp:
            native[f"{mlp[1]}.1.{mlp[2]}"] = tensor
        elif key.startswith("single_blocks.") and ".linear1." in key:
            block, suffix = key.split(".linear1.")
            if tensor.shape[0] <= qkv_rows:
                raise ModelLoadError(
                    f"{source}: {key} has {tensor.shape[0]} rows, expected "
                    "3 x hidden_size "
                    f"({qkv_rows}) + the MLP's: the file does not match "
                    "the model's config.json"
                )
            rows = tensor.shape[0]
            native[f"{block}.qkv.{suffix}"] = _rows(tensor, 0, qkv_rows)
            native[f"{block}.mlp_in.{suffix}"] = _rows(tensor, qkv_rows, rows)
        else:
            native[key] = tensor
    return native


def _rows(tensor: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a dense tensor or of a packed GGUF weight
    (layers/linear/gguf.py)."""
    return (
        tensor.rows(start, stop)
        if isinstance(tensor, QuantizedWeight)
        else tensor[start:stop].clone()
    )


def native_state_dict(
    state_dict: dict[str, Any], params: FluxParams, source: str
) -> tuple[dict[str, Any], str]:
    """A single file's tensors as the native module's state dict, and the layout they
    were in; a missing or unexpected key is a ModelLoadError naming it as the file
    does."""
    layout = detect_layout(state_dict, source)
    if layout == "diffusers" and any(
        isinstance(t, QuantizedWeight) for t in state_dict.values()
    ):
        raise ModelLoadError(
            f"{source}: quantized weights under diffusers' names "
            "are not read (Q/K/V would have "
            "to be fused packed); GGUF files with BFL names (city96's layout) are"
        )
    if layout == "diffusers":
        return convert_diffusers_state_dict(state_dict, params, source), layout
    # Checked in the file's own names: after the conversion a missing linear1 would be
    # two native keys.
    prefix = COMFYUI_PREFIX if layout == "comfyui" else ""
    # A ComfyUI file's other components aside.
    found = {key for key in state_dict if key.startswith(prefix)}
    expected = {prefix + _bfl_name(key) for key in conversion_rules(params)}
    check_key_match(
        source,
        "the transformer's config.json",
        missing=expected - found,
        unexpected=found - expected,
    )
    bfl = comfyui_transformer(state_dict, source) if layout == "comfyui" else state_dict
    return bfl_to_native(bfl, params, source), layout


def _bfl_name(native: str) -> str:
    """A native key as BFL's files name it (``bfl_to_native`` in reverse; a single
    block's ``qkv`` and ``mlp_in`` are both rows of its ``linear1``)."""
    if mlp := _NATIVE_MLP.match(native):
        return f"{mlp[1]}.2.{mlp[2]}"
    if single := _NATIVE_LINEAR1.match(native):
        return f"{single[1]}.linear1.{single[3]}"
    return native


def file_key_names(layout: str, params: FluxParams) -> Callable[[str], str]:
    """A native key -> how a file in ``layout`` names it, for load errors (a wrong
    shape); a single block's ``qkv`` / ``mlp_in`` are named as their rows of
    ``linear1``."""
    if layout == "diffusers":
        return diffusers_key_names(params)
    prefix = COMFYUI_PREFIX if layout == "comfyui" else ""
    qkv_rows = 3 * params.hidden_size

    def name(key: str) -> str:
        single = _NATIVE_LINEAR1.match(key)
        rows = (
            ""
            if single is None
            else f"[:{qkv_rows}]"
            if single[2] == "qkv"
            else f"[{qkv_rows}:]"
        )
        return prefix + _bfl_name(key) + rows

    return name
