"""Model directory -> pipeline class, by the diffusers ``model_index.json`` class name."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from diffserve.errors import ModelLoadError

# diffusers pipeline class name -> "module:Class" of ours (imported only when used).
PIPELINES: dict[str, str] = {
    "FluxPipeline": "diffserve.models.flux.pipeline:FluxPipeline",
}


def pipeline_class_name(model_dir: str | Path) -> str:
    index = Path(model_dir) / "model_index.json"
    try:
        return str(json.loads(index.read_text(encoding="utf-8"))["_class_name"])
    except FileNotFoundError:
        raise ModelLoadError(f"{index} is missing: {model_dir} is not a diffusers-format model directory") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{index} has no readable _class_name: {exc}") from exc


def pipeline_class_for(model_dir: str | Path) -> type:
    """The pipeline class that serves ``model_dir``; an unsupported architecture is a ``ModelLoadError``."""
    name = pipeline_class_name(model_dir)
    target = PIPELINES.get(name)
    if target is None:
        raise ModelLoadError(f"{model_dir} holds a {name}, which diffserve cannot serve; "
                             f"supported: {', '.join(PIPELINES)}")
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def load_pipeline(model_dir: str | Path, stage: Any, device: str = "cpu") -> Any:
    """Build the pipeline for ``model_dir`` with a resolved stage config (see ``FluxPipeline.from_stage``)."""
    return pipeline_class_for(model_dir).from_stage(model_dir, stage, device=device)
