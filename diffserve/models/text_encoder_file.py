"""FLUX's text encoders from single files (``components: {text_encoder: FILE,
text_encoder_2: FILE}``).

Two layouts, told apart by their keys:

- ``transformers``: the names a standalone file has (``clip_l.safetensors``:
  ``text_model.encoder.layers.N...``;
  ``t5xxl_fp16.safetensors``: ``encoder.block.N...`` and ``shared.weight``, the tied
  ``encoder.embed_tokens`` often left out);
- ``comfyui``: the same names under ``text_encoders.clip_l.transformer.`` /
  ``text_encoders.t5xxl.transformer.``,
  beside the transformer (``model.diffusion_model.``) and the VAE
  (``first_stage_model.``) in ComfyUI's all-in-one checkpoints.

The model folder's ``config.json`` describes the architecture; transformers builds the
module from the file's tensors, and every missing, unexpected or wrongly shaped key is
an error naming the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diffserve.errors import ModelLoadError
from diffserve.logging import get_logger
from diffserve.models.loader import (
    align_weights,
    check_loading_info,
    looks_like,
    read_checkpoint,
)

logger = get_logger(__name__)


@dataclass(frozen=True)
class TextEncoderFileLayout:
    """How one of FLUX's text encoders is named in single files."""

    what: str  # for errors: "CLIP-L", "T5-XXL"
    comfyui_prefix: str
    marker: str  # a key fragment every file of this encoder has
    # Tensors such files carry that the text-only model has no use for.
    droppable: frozenset[str]
    # A level released files have and transformers' model does not (it reports keys
    # without it).
    inner_prefix: str = ""


TEXT_ENCODER_FILES = {
    "text_encoder": TextEncoderFileLayout(
        "CLIP-L",
        "text_encoders.clip_l.transformer.",
        "encoder.layers.",
        # CLIPTextModelWithProjection's projection and CLIPModel's temperature: FLUX
        # uses the pooled output only.
        frozenset(
            {
                "text_projection.weight",
                "logit_scale",
                "text_model.embeddings.position_ids",
            }
        ),
        "text_model.",
    ),
    "text_encoder_2": TextEncoderFileLayout(
        "T5-XXL", "text_encoders.t5xxl.transformer.", "encoder.block.", frozenset()
    ),
}
# ComfyUI's "scaled fp8" files store float8 weights with a per-tensor scale that
# transformers does not apply.
_SCALED_FP8_MARKS = ("scaled_fp8", ".scale_weight", ".scale_input")


def text_encoder_layout(component: str, keys: list[str], source: str) -> str:
    """``transformers`` | ``comfyui`` for ``component``; anything else is a
    ModelLoadError saying what it found."""
    layout = TEXT_ENCODER_FILES[component]
    if any(k.startswith(layout.comfyui_prefix) and layout.marker in k for k in keys):
        return "comfyui"
    if any(
        layout.marker in k
        and not k.startswith(("text_encoders.", "model.", "first_stage_model."))
        for k in keys
    ):
        return "transformers"
    inner = (
        [k.split(".transformer.", 1)[-1] for k in keys]
        if any(k.startswith("text_encoders.") for k in keys)
        else keys
    )
    raise ModelLoadError(
        f"{source}: {looks_like(inner)}, expected the {layout.what} "
        f"text encoder ({component}: "
        f"`{layout.marker}N...`, or ComfyUI's `{layout.comfyui_prefix}...`)"
    )


def text_encoder_tensors(
    component: str, tensors: dict[str, torch.Tensor], source: str
) -> tuple[dict[str, Any], str]:
    """``component``'s tensors of a single file under transformers' names, and the
    layout they were in."""
    layout = TEXT_ENCODER_FILES[component]
    kind = text_encoder_layout(component, list(tensors), source)
    if kind == "comfyui":
        tensors = {
            k[len(layout.comfyui_prefix) :]: v
            for k, v in tensors.items()
            if k.startswith(layout.comfyui_prefix)
        }
    scaled = sorted(k for k in tensors if any(mark in k for mark in _SCALED_FP8_MARKS))
    if scaled:
        raise ModelLoadError(
            f"{source}: a scaled-fp8 checkpoint ({', '.join(scaled[:3])}): "
            "its weights need their "
            "scales applied, which is not supported; use the fp16/bf16 file"
        )
    integers = sorted(
        k
        for k, t in tensors.items()
        if not t.is_floating_point() and k not in layout.droppable
    )
    if integers:
        raise ModelLoadError(
            f"{source}: {len(integers)} tensors are stored as integers "
            "where the model has floating "
            "point weights: "
            + ", ".join(f"{k} ({tensors[k].dtype})" for k in integers[:5])
            + " "
            "(a quantized checkpoint in another format?)"
        )
    return {k: v for k, v in tensors.items() if k not in layout.droppable}, kind


def load_text_encoder(
    cls: Any,
    folder: str | Path,
    component: str,
    weights_file: str,
    *,
    dtype: torch.dtype,
) -> Any:
    """``cls`` (transformers' CLIPTextModel / T5EncoderModel) with ``folder``'s config
    and ``weights_file``'s weights, loaded strictly (T5's embedding is tied, so a file
    holding it once under either name is whole)."""
    config = cls.config_class.from_pretrained(str(folder))
    tensors, kind = text_encoder_tensors(
        component, read_checkpoint(weights_file), weights_file
    )
    if "shared.weight" not in tensors and "encoder.embed_tokens.weight" in tensors:
        tensors["shared.weight"] = tensors.pop("encoder.embed_tokens.weight")
    try:
        # ignore_mismatched_sizes: report a wrong shape in the loading info (refused
        # below, naming the key) instead of raising an error that points at a log table.
        model, info = cls.from_pretrained(
            None,
            config=config,
            state_dict=tensors,
            output_loading_info=True,
            dtype=dtype,
            ignore_mismatched_sizes=True,
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(
            f"{weights_file}: cannot load {component} ({cls.__name__}): {exc}"
        ) from None
    check_loading_info(
        weights_file,
        f"{component} ({cls.__name__}, config from {folder})",
        info,
        file_key=_file_key(component, kind, tensors),
    )
    logger.info("loaded %s from %s (%s layout)", component, weights_file, kind)
    return align_weights(model)


def _file_key(
    component: str, kind: str, tensors: dict[str, Any]
) -> Callable[[str], str]:
    """A key of transformers' loading report -> as the file names it (ComfyUI's prefix,
    CLIP's ``text_model.``)."""
    layout = TEXT_ENCODER_FILES[component]
    prefix = layout.comfyui_prefix if kind == "comfyui" else ""
    inner = (
        layout.inner_prefix
        if any(k.startswith(layout.inner_prefix) for k in tensors)
        else ""
    )

    def name(key: str) -> str:
        if key in tensors or key.startswith(inner) and inner + key not in tensors:
            return prefix + key
        # In the file under the level, or missing from a file that has it.
        return prefix + inner + key

    return name
