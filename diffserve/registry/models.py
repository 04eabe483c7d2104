"""Model families: the one list of what diffserve serves, keyed by ``model_index.json``'s ``_class_name``.

The resolver reads it for model defaults (topology), the attention roles a deploy file may name and the
"supported: ..." hint; the worker reads it to build the pipeline. Adding a family is one entry here plus
one folder under ``diffserve/models/`` whose pipeline class implements ``models.base.Pipeline``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffserve.registry.targets import load_target


@dataclass(frozen=True)
class ModelFamily:
    """What the resolver must know about a family before any weight is read."""

    class_name: str  # model_index.json "_class_name"
    pipeline: str  # "module:Class" of the pipeline (a models.base.Pipeline)
    topology: str  # default stage layout (config.schema.TOPOLOGIES)
    attention_roles: tuple[str, ...]  # attention call sites that may get their own backend
    max_world_size: int = 1  # ranks one replica may span (1: no parallel denoising)
    # The ``parallel.*`` degrees its pipeline implements (config/layout.py refuses any other above 1).
    parallel_dims: tuple[str, ...] = ()

    def load_pipeline_class(self) -> Any:
        return load_target(self.pipeline)


MODEL_FAMILIES: dict[str, ModelFamily] = {
    family.class_name: family
    for family in (
        ModelFamily("FluxPipeline", "diffserve.models.flux.pipeline:FluxPipeline", "single",
                    attention_roles=("double_block", "single_block"),
                    # CFG-parallel (the two true-CFG branches on two ranks) times Ulysses (the image
                    # tokens; the degree must divide the heads, checked at load: models/flux/pipeline.py).
                    max_world_size=16, parallel_dims=("cfg_parallel_size", "ulysses_degree")),
    )
}


def known_attention_roles() -> tuple[str, ...]:
    """Every role some family declares (what a deploy file may name before the model is known)."""
    return tuple(dict.fromkeys(role for f in MODEL_FAMILIES.values() for role in f.attention_roles))


def read_class_name(model_dir: str | Path) -> str:
    """``_class_name`` of ``model_dir/model_index.json`` (OSError/ValueError/KeyError propagate)."""
    index = Path(model_dir) / "model_index.json"
    return str(json.loads(index.read_text(encoding="utf-8"))["_class_name"])
