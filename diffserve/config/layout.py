"""Whether a resolved stage can be run: can its executor and its model run the requested
number of ranks per replica, and do the attention roles it names exist in its model. Any
``num_replicas`` runs: each replica is an independent copy of the stage's worker group
(``engine/replicas.py``).

Checked when the executor is built (``executor/factory.py``), not by ``resolve()``: a
config is a description that ``config explain`` must be able to show whatever it asks
for; running it is what needs these rules. Each rule reads the registries (executor and
model family tables), so a new executor or family that can do more changes the answer
without touching this file. Failures are ordinary ``ConfigError``s with the key path and
the file:line of the value that asked for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from diffserve.config.provenance import DEFAULT_SOURCE, Collector, Source
from diffserve.config.resolved import ResolvedConfig
from diffserve.config.schema import StageConfig
from diffserve.errors import ConfigErrors
from diffserve.registry.executors import EXECUTORS
from diffserve.registry.models import MODEL_FAMILIES, ModelFamily

# Each parallel degree and what it parallelizes (for the refusal message).
_DEGREES = {
    "tensor_parallel_size": "tensor parallelism",
    "cfg_parallel_size": "CFG parallelism",
    "ulysses_degree": "Ulysses sequence parallelism",
    "ring_degree": "ring-attention sequence parallelism",
}


def require_runnable(config: ResolvedConfig, stage: StageConfig) -> None:
    """Raise ``ConfigError`` (``ConfigErrors`` for several) if ``stage`` cannot run as
    configured."""
    out = Collector()
    family = MODEL_FAMILIES.get(config.model_family) if config.model_family else None
    check_layout(stage, family, config.provenance, out)
    if len(out.errors) == 1:
        raise out.errors[0]
    if out.errors:
        raise ConfigErrors(out.errors)


def _check_family_parallel(
    stage: StageConfig,
    family: ModelFamily,
    where: Callable[[str], Source],
    out: Collector,
) -> None:
    prefix = f"stages.{stage.stage_id}"
    # The generic path runs diffusers' own pipeline on one rank: no parallel denoising
    # there.
    dims = family.parallel.dims if stage.implementation == "native" else ()
    supported = ", ".join(dims) or "none"
    refused = [
        name
        for name in _DEGREES
        if getattr(stage.parallel, name) > 1 and name not in dims
    ]
    for name in refused:
        where_runs = "" if stage.implementation == "native" else " on the generic path"
        out.error(
            f"parallel.{name} {getattr(stage.parallel, name)}: "
            f"{family.class_name}{where_runs} "
            "does not run "
            f"{_DEGREES[name]}",
            path=f"{prefix}.parallel.{name}",
            source=where(f"parallel.{name}"),
            hint=f"set parallel.{name}: 1 (parallel degrees this model "
            f"runs: {supported})",
        )
    world = stage.parallel.world_size
    if not refused and world > family.parallel.max_world_size:
        source = next(
            where(f"parallel.{name}")
            for name in _DEGREES
            if getattr(stage.parallel, name) > 1
        )
        out.error(
            f"parallel world size {world}: {family.class_name} runs "
            f"at most {family.parallel.max_world_size} "
            "ranks per replica",
            path=f"{prefix}.parallel",
            source=source,
            hint=f"lower the parallel degrees (this model runs: {supported}); "
            "use num_replicas for more",
        )


def check_layout(
    stage: StageConfig,
    family: ModelFamily | None,
    provenance: Mapping[str, Source],
    out: Collector,
) -> None:
    prefix = f"stages.{stage.stage_id}"

    def where(key: str) -> Source:
        return provenance.get(f"{prefix}.{key}", DEFAULT_SOURCE)

    world = stage.parallel.world_size
    parallel_source = next(
        (
            where(f"parallel.{name}")
            for name in _DEGREES
            if getattr(stage.parallel, name) > 1
        ),
        DEFAULT_SOURCE,
    )
    executor = EXECUTORS[stage.distributed_executor_backend]
    if executor.max_world_size is not None and world > executor.max_world_size:
        others = " or ".join(
            name
            for name, spec in EXECUTORS.items()
            if spec.max_world_size is None or spec.max_world_size >= world
        )
        out.error(
            f"parallel world size {world} needs {world} ranks, but "
            f"the {executor.name!r} executor runs "
            f"{executor.max_world_size}",
            path=f"{prefix}.parallel",
            source=parallel_source,
            hint=f"set distributed_executor_backend: {others}, or the "
            "parallel degrees to 1",
        )
    if stage.parallel.cfg_parallel_size > 2:
        # True CFG has two branches (prompt, negative prompt): a third rank would have
        # nothing to do.
        out.error(
            f"cfg_parallel_size {stage.parallel.cfg_parallel_size}: "
            "true CFG has two branches, so "
            "it is 1 or 2",
            path=f"{prefix}.parallel.cfg_parallel_size",
            source=where("parallel.cfg_parallel_size"),
            hint="set parallel.cfg_parallel_size: 2",
        )
    if family is not None:
        _check_family_parallel(stage, family, where, out)
    if family is not None:
        unknown = sorted(
            set(stage.attention_backend.roles) - set(family.attention_roles)
        )
        if unknown:
            out.error(
                f"attention role(s) {unknown} do not exist in {family.class_name}",
                path=f"{prefix}.attention_backend",
                source=where(f"attention_backend.{unknown[0]}"),
                hint="roles of this model: "
                f"default, {', '.join(family.attention_roles)}",
            )
