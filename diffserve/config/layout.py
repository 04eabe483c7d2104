"""Whether a resolved stage can be run: can its executor and its model run the requested number of
ranks per replica, and do the attention roles it names exist in its model. Any ``num_replicas`` runs:
each replica is an independent copy of the stage's worker group (``engine/replicas.py``).

Checked when the executor is built (``executor/factory.py``), not by ``resolve()``: a config is a
description that ``config explain`` must be able to show whatever it asks for; running it is what
needs these rules. Each rule reads the registries (executor and model family tables), so a new executor
or family that can do more changes the answer without touching this file. Failures are ordinary
``ConfigError``s with the key path and the file:line of the value that asked for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from diffserve.config.provenance import DEFAULT_SOURCE, Collector, Source
from diffserve.config.resolved import ResolvedConfig
from diffserve.config.schema import StageConfig
from diffserve.errors import ConfigErrors
from diffserve.registry.executors import EXECUTORS
from diffserve.registry.models import MODEL_FAMILIES, ModelFamily


def require_runnable(config: ResolvedConfig, stage: StageConfig) -> None:
    """Raise ``ConfigError`` (``ConfigErrors`` for several) if ``stage`` cannot run as configured."""
    out = Collector()
    family = MODEL_FAMILIES.get(config.model_family) if config.model_family else None
    check_layout(stage, family, config.provenance, out)
    if len(out.errors) == 1:
        raise out.errors[0]
    if out.errors:
        raise ConfigErrors(out.errors)


def check_layout(stage: StageConfig, family: ModelFamily | None, provenance: Mapping[str, Source],
                 out: Collector) -> None:
    prefix = f"stages.{stage.stage_id}"

    def where(key: str) -> Source:
        return provenance.get(f"{prefix}.{key}", DEFAULT_SOURCE)

    world = stage.parallel.world_size
    parallel_source = next((where(f"parallel.{name}") for name in
                            ("tensor_parallel_size", "cfg_parallel_size", "ulysses_degree", "ring_degree")
                            if getattr(stage.parallel, name) > 1), DEFAULT_SOURCE)
    executor = EXECUTORS[stage.distributed_executor_backend]
    if executor.max_world_size is not None and world > executor.max_world_size:
        out.error(f"parallel world size {world} needs {world} ranks, but the {executor.name!r} executor runs "
                  f"{executor.max_world_size}", path=f"{prefix}.parallel", source=parallel_source,
                  hint="set distributed_executor_backend: mp, or the parallel degrees to 1")
    if family is not None and world > family.max_world_size:
        out.error(f"parallel world size {world}: {family.class_name} does not run CFG/sequence/tensor "
                  f"parallelism yet (at most {family.max_world_size} rank per replica)",
                  path=f"{prefix}.parallel", source=parallel_source, hint="set the parallel degrees to 1")
    if family is not None:
        unknown = sorted(set(stage.attention_backend.roles) - set(family.attention_roles))
        if unknown:
            out.error(f"attention role(s) {unknown} do not exist in {family.class_name}",
                      path=f"{prefix}.attention_backend", source=where(f"attention_backend.{unknown[0]}"),
                      hint=f"roles of this model: default, {', '.join(family.attention_roles)}")
