"""The model layer of the config: what the model directory brings (its family's
topology, implementation, quantization-ignored layers and request defaults; a TeaCache
polynomial that fits it; its own marker's request defaults and example prompts), each
recorded with source ``model``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from diffserve.config.fields import did_you_mean
from diffserve.config.provenance import LAYER_RANK, Collector, Source
from diffserve.registry.example_prompts import (
    EXAMPLE_PROMPTS_KEY,
    parse_example_prompts,
)
from diffserve.registry.models import (
    MODEL_FAMILIES,
    MODEL_MARKER_FILE,
    ModelFamily,
    denoiser_components,
    read_class_name,
)
from diffserve.registry.teacache import polynomial_for


def model_layer(
    model: str | os.PathLike | None, out: Collector
) -> tuple[str | None, ModelFamily | None]:
    """Read ``model_index.json`` (nothing heavier): the model's family and its default
    topology."""
    if model is None:
        return None, None
    if not isinstance(model, (str, os.PathLike)):
        out.error(
            f"model must be a directory path, got {type(model).__name__}",
            path="model",
            source="caller",
        )
        return None, None
    path = Path(model).expanduser()
    index = path / "model_index.json"
    if not path.is_dir():
        out.error(
            "model directory not found",
            path="model",
            source=str(path),
            hint="pass a local diffusers-format directory or a hub id, "
            "org/name[@revision]",
        )
        return str(path), None
    try:
        class_name = read_class_name(path)
    except FileNotFoundError:
        out.error(
            "not a diffusers model directory (no model_index.json)",
            path="model",
            source=str(path),
            hint="point at the directory that contains model_index.json",
        )
        return str(path.resolve()), None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        out.error(
            f"model_index.json is unreadable: {exc}", path="model", source=str(index)
        )
        return str(path.resolve()), None
    family = MODEL_FAMILIES.get(class_name)
    if family is None:
        supported = "supported text-to-image DiT pipelines: " + ", ".join(
            f"{name} ({f.implementation})" for name, f in MODEL_FAMILIES.items()
        )
        close = did_you_mean(class_name, MODEL_FAMILIES)
        out.error(
            f"unsupported pipeline class {class_name!r}",
            path="model_index.json:_class_name",
            source=str(index),
            hint=f"{close} {supported}" if close else supported,
        )
        return str(path.resolve()), None
    source = Source("model", str(index), None, class_name)
    out.add(LAYER_RANK["model"], None, "topology", family.topology, source)
    # What the family brings: which implementation serves it and its checkpoints'
    # request defaults.
    rank = LAYER_RANK["model"]
    out.add(
        rank,
        None,
        "implementation",
        family.implementation,
        Source(
            "model", str(index), None, f"{class_name}: {family.implementation} path"
        ),
    )
    out.add(
        rank,
        None,
        "quantization_ignored_layers",
        family.features.quantization_ignored_layers,
        Source("model", str(index), None, f"{class_name}: layers kept unquantized"),
    )
    _model_teacache_polynomial(path, class_name, out)
    defaults = family.defaults.request_defaults()
    marker_defaults, marker_source = _marker_request_defaults(path, out)
    for key, value in defaults.items():
        if key not in marker_defaults:
            out.add(rank, None, f"request_defaults.{key}", value, source)
    # What the model declares of the family's keys, its size (no family has one: the
    # VAE's or Wan's) and its text window (a model trained on fewer tokens than its
    # family's)
    for key, value in marker_defaults.items():
        if key in defaults or key in ("height", "width", "max_sequence_length"):
            out.add(rank, None, f"request_defaults.{key}", value, marker_source)
    _check_marker_example_prompts(path, out)
    return str(path.resolve()), family


def _model_teacache_polynomial(path: Path, class_name: str, out: Collector) -> None:
    """``cache.teacache_coefficients`` from the model: the published TeaCache polynomial
    fitted on its shape, if any (``registry/teacache.py``); read from its JSON configs
    only."""
    try:
        index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
        config_file = path / "transformer" / "config.json"
        config = (
            json.loads(config_file.read_text(encoding="utf-8"))
            if config_file.is_file()
            else {}
        )
    except (OSError, ValueError):
        # an unreadable config is the loader's error to report, with its own context
        return
    experts = len(denoiser_components(index))
    fit = polynomial_for(
        class_name, config if isinstance(config, dict) else {}, experts
    )
    if fit is not None:
        out.add(
            LAYER_RANK["model"],
            None,
            "cache.teacache_coefficients",
            fit[0],
            Source("model", str(path / "model_index.json"), None, fit[1]),
        )


def _marker_request_defaults(
    path: Path, out: Collector
) -> tuple[dict[str, Any], Source]:
    """The model's own ``request_defaults`` from its marker file
    (``diffserve_model.json``), if it declares any: ``num_inference_steps``,
    ``guidance_scale``, ``height``, ``width``, ``max_sequence_length`` (and a video
    model's ``num_frames``, ``fps``), which replace the family's."""
    marker = path / MODEL_MARKER_FILE
    source = Source("model", str(marker), None, "the model's request_defaults")
    if not marker.is_file():
        return {}, source
    try:
        doc = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        out.error(
            f"{MODEL_MARKER_FILE} is unreadable: {exc}",
            path="model",
            source=str(marker),
        )
        return {}, source
    declared = doc.get("request_defaults") if isinstance(doc, dict) else None
    if declared is None:
        return {}, source
    if not isinstance(declared, dict):
        out.error(
            "request_defaults must be a mapping",
            path=f"{MODEL_MARKER_FILE}:request_defaults",
            source=str(marker),
        )
        return {}, source
    known = {
        "num_inference_steps",
        "guidance_scale",
        "num_frames",
        "fps",
        "height",
        "width",
        "max_sequence_length",
    }
    for key in sorted(set(declared) - known):
        out.error(
            f"unknown request default {key!r}",
            path=f"{MODEL_MARKER_FILE}:request_defaults.{key}",
            source=str(marker),
            hint=f"choose from: {', '.join(sorted(known))}",
        )
    return {k: v for k, v in declared.items() if k in known}, source


def _check_marker_example_prompts(path: Path, out: Collector) -> None:
    """Refuse a marker whose ``example_prompts`` is not a list of non-empty strings,
    here at resolve rather than as a blank prompt box in the playground (the server
    reads them: registry/example_prompts.py)."""
    marker = path / MODEL_MARKER_FILE
    try:
        doc = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no marker; an unreadable one is reported by _marker_request_defaults
    try:
        parse_example_prompts(doc)
    except ValueError as exc:
        out.error(
            str(exc),
            path=f"{MODEL_MARKER_FILE}:{EXAMPLE_PROMPTS_KEY}",
            source=str(marker),
            hint=f'write "{EXAMPLE_PROMPTS_KEY}": ["a prompt the model knows", ...]',
        )
