"""The one resolver: every source -> assignments -> the single precedence order ->
ResolvedConfig.

Precedence, low to high (``provenance.LAYER_RANK``): schema default < model directory <
base_config ancestors < deploy YAML < ``platforms.<current>`` < ``DIFFSERVE_*`` env <
caller/CLI global < caller/CLI per stage. Layers are ordered first; inside one layer a
stage-scoped value beats a pipeline-wide one. Defaults are filled in last and recorded
as ``default``: never explicit. ``_pick`` below is the only place where values are
merged.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from diffserve.config.ar_ingest import is_ar_key
from diffserve.config.ar_resolve import build_ar_stages
from diffserve.config.autoscaling import autoscaling_errors
from diffserve.config.cache import settle_cache
from diffserve.config.device_rules import device_errors
from diffserve.config.explain import fingerprint_of
from diffserve.config.extras import fold_extras
from diffserve.config.family_rules import (
    component_errors,
    generic_cache_errors,
    implementation_errors,
    text_window_errors,
)
from diffserve.config.fields import PIPELINE_LEAVES, STAGE_LEAVES
from diffserve.config.model_layer import model_layer
from diffserve.config.model_source import locate_model
from diffserve.config.platform import current_platform
from diffserve.config.platform_defaults import apply_platform_defaults
from diffserve.config.provenance import DEFAULT_SOURCE, Assignment, Collector, Source
from diffserve.config.requirements import missing_requirements
from diffserve.config.resolved import ResolvedConfig
from diffserve.config.schema import TOPOLOGIES, FrozenDict, StageConfig
from diffserve.config.server_schema import ServerConfig
from diffserve.config.sources import caller_layers, deploy_layers, env_layer
from diffserve.config.stage_sections import ATTENTION_ROLES, AttentionBackendConfig
from diffserve.errors import ConfigError, ConfigErrors
from diffserve.logging import get_logger

logger = get_logger(__name__)

__all__ = ["ResolvedConfig", "StageConfig", "resolve"]

# The nested sections of a stage (parallel, cache, warmup, vae, ...), as schema.py
# declares them.
_SECTION_TYPES = {
    f.name: f.metadata["section"]
    for f in dataclasses.fields(StageConfig)
    if "section" in f.metadata
}
# And of the server section (autoscaling).
_SERVER_SECTION_TYPES = {
    f.name: f.metadata["section"]
    for f in dataclasses.fields(ServerConfig)
    if "section" in f.metadata
}


def resolve(
    model: str | os.PathLike | None = None,
    deploy_config: str | os.PathLike | Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    stage_overrides: Mapping[Any, Mapping[str, Any]] | None = None,
    platform: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ResolvedConfig:
    """Resolve every config source into one frozen ``ResolvedConfig``.

    ``model`` is a diffusers directory or a hub id ``org/name[@revision]`` (None: the
    deploy file's ``model:``). ``deploy_config`` is a YAML path (or a dict, cited as
    ``<dict>``); ``overrides`` are caller/CLI values for every stage (YAML keys or flat
    flag names; None = not given); ``stage_overrides`` maps stage_id -> values for that
    stage; ``platform`` None detects it; ``env`` None reads os.environ. Raises
    ConfigError (ConfigErrors when there are several problems), never anything else.
    """
    out = Collector()
    try:
        platform_name = current_platform(platform)
    except ConfigError as exc:
        out.errors.append(exc)
        platform_name = "cpu"  # placeholder so the remaining sources are still checked
    files = deploy_layers(deploy_config, platform_name, out)
    env_layer(os.environ if env is None else env, out)
    caller_layers(overrides, stage_overrides, out)
    # After the other layers (ranks, not call order, decide precedence): a hub download
    # skips the weights of components that some layer takes from a single file.
    source = locate_model(model, out)
    model_path, family = model_layer(source.path if source else None, out)
    # Invalid values were dropped at ingress; carry on so one run reports every problem.

    pipeline = _pick(out.assignments, None, pipeline_keys=True)
    topology, _ = pipeline.get(
        "topology", (PIPELINE_LEAVES["topology"].default, DEFAULT_SOURCE)
    )
    roles = TOPOLOGIES[topology]
    provenance: dict[str, Source] = {}
    # The AR stages (kind: ar) run first: stage_ids 0..N-1; the topology's stages follow
    # them.
    ar_stages = build_ar_stages(
        out,
        platform_name,
        lambda stage_id: _pick(out.assignments, stage_id, ar=True),
        provenance,
    )
    first = len(ar_stages)
    _check_stage_refs(out, topology, roles, first)

    server = _server(pipeline, provenance)
    out.errors.extend(autoscaling_errors(server.autoscaling, provenance))
    provenance["topology"] = pipeline.get("topology", (None, DEFAULT_SOURCE))[1]
    ray_address, provenance["ray_address"] = pipeline.get(
        "ray_address", (PIPELINE_LEAVES["ray_address"].default, DEFAULT_SOURCE)
    )
    warnings: list[str] = []
    stages = tuple(
        _build_stage(stage_id, role, out, provenance, warnings, platform_name)
        for stage_id, role in enumerate(roles, start=first)
    )
    out.errors.extend(missing_requirements(stages, provenance))
    out.errors.extend(implementation_errors(stages, family, provenance))
    out.errors.extend(component_errors(stages, family, provenance))
    out.errors.extend(generic_cache_errors(stages, family, provenance))
    out.errors.extend(text_window_errors(stages, family, provenance))
    out.errors.extend(device_errors(stages, platform_name, provenance))
    _raise_if_errors(out.errors)
    for warning in warnings:
        logger.warning("%s", warning)

    resolved = ResolvedConfig(
        model=model_path,
        model_family=family.class_name if family else None,
        topology=topology,
        platform=platform_name,
        server=server,
        stages=stages,
        ar_stages=ar_stages,
        provenance=FrozenDict(provenance),
        warnings=tuple(warnings),
        deploy_files=tuple(files),
        ray_address=ray_address,
        model_source=source if model_path else None,
    )
    return _replace_fingerprint(resolved)


def _pick(
    assignments: Iterable[Assignment],
    stage_id: int | None,
    *,
    pipeline_keys: bool = False,
    ar: bool = False,
) -> dict[str, tuple[Any, Source]]:
    """THE precedence rule: per key, highest rank wins; on equal rank a stage value
    beats a pipeline-wide one; on a full tie the later source wins. Picks pipeline-only
    keys (topology, server.*), the keys of stage ``stage_id``, or (``ar``) an AR stage's
    own keys (pipeline-wide values are the diffusion stages')."""
    best: dict[str, tuple[tuple[int, bool, int], Assignment]] = {}
    for order, item in enumerate(assignments):
        if (
            item.stage_id not in (None, stage_id)
            or is_ar_key(item.key) != ar
            or (ar and item.stage_id is None)
        ):
            continue
        if (item.key in PIPELINE_LEAVES) != pipeline_keys:
            continue
        priority = (item.rank, item.stage_id is not None, order)
        if item.key not in best or priority > best[item.key][0]:
            best[item.key] = (priority, item)
    return {key: (item.value, item.source) for key, (_, item) in best.items()}


def _server(
    picked: Mapping[str, tuple[Any, Source]], provenance: dict[str, Source]
) -> ServerConfig:
    """The pipeline-wide server limits; unset ones take the schema default, recorded as
    default."""
    values: dict[str, Any] = {}
    for key, leaf in PIPELINE_LEAVES.items():
        if key.startswith("server."):
            values[key.removeprefix("server.")], provenance[key] = picked.get(
                key, (leaf.default, DEFAULT_SOURCE)
            )
    sections = {
        name: cls(
            **{
                k.split(".", 1)[1]: values.pop(k)
                for k in list(values)
                if k.startswith(f"{name}.")
            }
        )
        for name, cls in _SERVER_SECTION_TYPES.items()
    }
    return ServerConfig(**sections, **values)


def _check_stage_refs(
    out: Collector, topology: str, roles: tuple[str, ...], first: int
) -> None:
    """Every diffusion stage a document names exists: stage_ids ``first``.. (after the
    AR stages)."""
    for ref in out.stage_refs:
        if not first <= ref.stage_id < first + len(roles):
            layout = ", ".join(
                f"{i} = {role}" for i, role in enumerate(roles, start=first)
            )
            out.error(
                f"stage_id {ref.stage_id} does not exist in topology "
                f"{topology!r} ({layout})",
                path=ref.path,
                source=ref.source,
                hint="use an existing stage_id, or choose a topology with that stage "
                f"(topologies: {', '.join(TOPOLOGIES)})",
            )


def _build_stage(
    stage_id: int,
    role: str,
    out: Collector,
    provenance: dict[str, Source],
    warnings: list[str],
    platform: str,
) -> StageConfig:
    picked = _pick(out.assignments, stage_id, pipeline_keys=False)
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for key, leaf in STAGE_LEAVES.items():
        if leaf.kind == "attention":
            key = "attention_backend.default"
        values[key], sources[key] = picked.get(key, (leaf.default, DEFAULT_SOURCE))
    for key, (value, source) in picked.items():
        if key.startswith(("extras.", "attention_backend.")) and key not in values:
            values[key], sources[key] = value, source
    fold_extras(stage_id, values, sources, out, warnings)
    apply_platform_defaults(platform, values, sources)
    settle_cache(stage_id, values, sources, out)

    default = values.pop("attention_backend.default")
    # Canonical form: a role equal to the default is the default (so spellings
    # fingerprint alike).
    roles = {
        r: values.pop(f"attention_backend.{r}")
        for r in ATTENTION_ROLES
        if f"attention_backend.{r}" in values
    }
    for r in list(roles):
        if roles[r] == default:
            del roles[r]
            del sources[f"attention_backend.{r}"]
    extras = {
        k.removeprefix("extras."): values.pop(k)
        for k in sorted(values)
        if k.startswith("extras.")
    }
    sections = {
        name: cls(
            **{
                k.split(".", 1)[1]: values.pop(k)
                for k in list(values)
                if k.startswith(f"{name}.")
            }
        )
        for name, cls in _SECTION_TYPES.items()
    }
    for key, source in sources.items():
        provenance[f"stages.{stage_id}.{key}"] = source
    return StageConfig(
        stage_id=stage_id,
        role=role,
        attention_backend=AttentionBackendConfig(default, FrozenDict(roles)),
        extras=FrozenDict(extras),
        **sections,
        **values,
    )


def _raise_if_errors(errors: list[ConfigError]) -> None:
    unique = list({str(e): e for e in errors}.values())
    if len(unique) == 1:
        raise unique[0]
    if unique:
        raise ConfigErrors(unique)


def _replace_fingerprint(resolved: ResolvedConfig) -> ResolvedConfig:
    return dataclasses.replace(resolved, fingerprint=fingerprint_of(resolved))
