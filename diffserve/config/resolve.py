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
from diffserve.config.fields import PIPELINE_LEAVES, STAGE_LEAVES
from diffserve.config.model_source import locate_model
from diffserve.config.platform import current_platform
from diffserve.config.platform_defaults import apply_platform_defaults
from diffserve.config.provenance import DEFAULT_SOURCE, Assignment, Collector, Source
from diffserve.config.requirements import missing_requirements
from diffserve.config.resolved import ResolvedConfig
from diffserve.config.schema import (
    ATTENTION_ROLES,
    TOPOLOGIES,
    AttentionBackendConfig,
    FrozenDict,
    ServerConfig,
    StageConfig,
)
from diffserve.config.sources import (
    caller_layers,
    deploy_layers,
    env_layer,
    model_layer,
)
from diffserve.errors import ConfigError, ConfigErrors
from diffserve.logging import get_logger
from diffserve.registry.models import MODEL_FAMILIES

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
    out.errors.extend(_implementation_errors(stages, family, provenance))
    out.errors.extend(_component_errors(stages, family, provenance))
    out.errors.extend(_generic_cache_errors(stages, family, provenance))
    out.errors.extend(_text_window_errors(stages, family, provenance))
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


def _implementation_errors(
    stages: tuple[StageConfig, ...], family: Any, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """``implementation: native`` on a family that only the generic path serves (the
    reverse is allowed: any family can run on diffusers' own pipeline class); a topology
    with a stage role the family has no pipeline for (the generic path runs diffusers'
    pipeline whole: one stage)."""
    errors = []
    if family is not None:
        roles = dict(family.features.stage_pipelines)
        for stage in stages:
            if stage.role == "diffusion":
                continue
            generic = (
                any(s.implementation == "generic" for s in stages)
                or family.implementation == "generic"
            )
            if stage.role not in roles or generic:
                errors.append(
                    ConfigError(
                        f"{family.class_name} "
                        f"on the {'generic' if generic else 'native'} "
                        "path has no "
                        f"{stage.role} stage",
                        path="topology",
                        source=provenance["topology"].describe(),
                        hint="use topology: single"
                        + (
                            f" (a {stage.role} stage runs on: "
                            + ", ".join(
                                n
                                for n, f in MODEL_FAMILIES.items()
                                if stage.role in dict(f.features.stage_pipelines)
                            )
                            + ")"
                            if stage.role
                            else ""
                        ),
                    )
                )
    if family is None or family.implementation == "native":
        return errors
    return errors + [
        ConfigError(
            f"{family.class_name} has no native implementation",
            path=key,
            source=provenance[key].describe(),
            hint="use implementation: generic (or leave it unset)",
        )
        for key in (
            f"stages.{s.stage_id}.implementation"
            for s in stages
            if s.implementation == "native"
        )
    ]


def _text_window_errors(
    stages: tuple[StageConfig, ...], family: Any, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """A default text length past the model's window: every request that sends none
    would be refused."""
    errors: list[ConfigError] = []
    for stage in stages:
        length, key = (
            stage.request_defaults.max_sequence_length,
            f"stages.{stage.stage_id}.request_defaults.max_sequence_length",
        )
        if (
            family is not None
            and length is not None
            and length > family.defaults.max_sequence_length
        ):
            errors.append(
                ConfigError(
                    f"{length} text tokens is past {family.class_name}'s window of "
                    f"{family.defaults.max_sequence_length}",
                    path=key,
                    source=provenance[key].describe(),
                    hint=f"use at most {family.defaults.max_sequence_length} "
                    "(or leave it unset)",
                )
            )
    return errors


def _generic_cache_errors(
    stages: tuple[StageConfig, ...], family: Any, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """A step cache on the generic path: First-Block Cache where the family names its
    blocks, eager; TeaCache nowhere (its polynomial is fitted per family, and none is
    published for these)."""
    errors: list[ConfigError] = []
    for stage in stages:
        generic = stage.implementation == "generic" or (
            family is not None and family.implementation == "generic"
        )
        backend, key = stage.cache.backend, f"stages.{stage.stage_id}.cache.backend"
        if family is None or not generic or backend == "none":
            continue
        source = provenance[key].describe()
        if backend == "teacache":
            errors.append(
                ConfigError(
                    "TeaCache rescales its signal with a polynomial fitted "
                    "per model family, and none is published for "
                    f"{family.class_name}",
                    path=key,
                    source=source,
                    hint="use cache.backend: fbcache"
                    if family.generic.first_block_cache
                    else "use cache.backend: none",
                )
            )
        elif family.generic.first_block_cache is None:
            errors.append(
                ConfigError(
                    f"{family.class_name} on the generic path has no step cache",
                    path=key,
                    source=source,
                    hint="use cache.backend: none"
                    + (
                        " (or implementation: native, which has one)"
                        if family.implementation == "native"
                        else ""
                    ),
                )
            )
        elif not stage.enforce_eager:
            errors.append(
                ConfigError(
                    "First-Block Cache on the generic path runs eager (a "
                    "compiled block is counted per forward, and a "
                    "skipped one would be counted too)",
                    path=f"stages.{stage.stage_id}.enforce_eager",
                    source=provenance[
                        f"stages.{stage.stage_id}.enforce_eager"
                    ].describe(),
                    hint="set enforce_eager: true",
                )
            )
    return errors


def _component_errors(
    stages: tuple[StageConfig, ...], family: Any, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """Single-file components: the file must exist, the stage must run its family's
    native path, and the family must read that component from a file (the registry's
    ``single_file_components``)."""
    errors = []
    for stage in stages:
        key = f"stages.{stage.stage_id}.components"
        for name, path in stage.components.items():
            if not os.path.isfile(path):
                errors.append(
                    ConfigError(
                        f"{name}: no such file {path}",
                        path=f"{key}.{name}",
                        source=provenance[key].describe(),
                        hint="give an existing .safetensors file",
                    )
                )
        if (
            stage.components.get("transformer", "").endswith(".gguf")
            and not stage.enforce_eager
        ):
            errors.append(
                ConfigError(
                    "a GGUF transformer runs eager (its weights are dequantized "
                    "per call)",
                    path=f"stages.{stage.stage_id}.enforce_eager",
                    source=provenance[
                        f"stages.{stage.stage_id}.enforce_eager"
                    ].describe(),
                    hint="set enforce_eager: true (--enforce-eager)",
                )
            )
        if not stage.components or family is None:
            continue
        if stage.implementation != "native" or family.implementation != "native":
            errors.append(
                ConfigError(
                    "single-file components are read on the native path "
                    f"only (by {_readers()}); "
                    f"{family.class_name} runs on the {stage.implementation} path here",
                    path=key,
                    source=provenance[key].describe(),
                    hint="serve the component from the model's folder, or use "
                    "implementation: native",
                )
            )
            continue
        takes = (
            f"it reads {', '.join(family.features.single_file_components)} "
            "from single files"
            if family.features.single_file_components
            else "it reads no component from a single file"
        )
        for name in stage.components:
            if name not in family.features.single_file_components:
                # Refused, not ignored: the file would otherwise be fingerprinted as
                # served and never read.
                errors.append(
                    ConfigError(
                        f"{family.class_name} does not read its {name} from "
                        f"a single file ({takes})",
                        path=f"{key}.{name}",
                        source=provenance[key].describe(),
                        hint=f"serve the {name} from "
                        "the model's folder: "
                        f"drop components.{name}",
                    )
                )
    return errors


def _readers() -> str:
    """The families whose native pipeline reads some component from a single file."""
    return (
        ", ".join(
            name
            for name, f in MODEL_FAMILIES.items()
            if f.features.single_file_components
        )
        or "none"
    )


def _raise_if_errors(errors: list[ConfigError]) -> None:
    unique = list({str(e): e for e in errors}.values())
    if len(unique) == 1:
        raise unique[0]
    if unique:
        raise ConfigErrors(unique)


def _replace_fingerprint(resolved: ResolvedConfig) -> ResolvedConfig:
    return dataclasses.replace(resolved, fingerprint=fingerprint_of(resolved))
