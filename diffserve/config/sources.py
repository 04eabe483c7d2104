"""The config sources, each turned into assignments at its rank: model directory, deploy
YAML (with its base_config chain and platform overlays), environment, and caller/CLI
overrides.

Sources only read and canonicalize; the resolver alone decides which value wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diffserve.config.ar_ingest import ar_stage_mapping
from diffserve.config.canonical import normalize_platform
from diffserve.config.fields import FLAT_LEAVES, did_you_mean
from diffserve.config.ingest import Ctx, stage_mapping
from diffserve.config.ingest_document import pipeline_doc, stage_id_of
from diffserve.config.model_source import deploy_model
from diffserve.config.provenance import (
    LAYER_RANK,
    MAX_CHAIN,
    Collector,
    Source,
    StageRef,
)
from diffserve.config.schema import PLATFORMS
from diffserve.config.yaml_lines import key_line, load_yaml_file
from diffserve.errors import ConfigError
from diffserve.logging import get_logger

logger = get_logger(__name__)

ENV_PREFIX = "DIFFSERVE_"
# DIFFSERVE_* variables that are read elsewhere and are not config fields.
# Tracing/settings.py; WEBHOOK_SECRETS: entrypoints/webhooks/signing.py (a secret, so
# never a config value: the config is fingerprinted and shown).
NON_CONFIG_ENV: frozenset[str] = frozenset(
    {
        "LOG_LEVEL",
        "CACHE_DIR",
        "API_KEY",
        "CPU_BF16",
        "CPU_KIND",
        "TRACE_STEPS",
        "WEBHOOK_SECRETS",
    }
)
_DECK_KEYS = ("base_config", "platforms", "model")


def _load_chain(
    deploy_config: str | os.PathLike | Mapping, out: Collector
) -> list[tuple[str, Mapping]]:
    """The deploy file and its base_config ancestors, root ancestor first."""
    chain: list[tuple[str, Mapping]] = []
    seen: list[Path] = []
    # A models: entry (model_list.DeployEntry) cites its file.
    if isinstance(deploy_config, Mapping):
        name = getattr(deploy_config, "source_name", "<dict>")
        doc, base_dir = deploy_config, getattr(deploy_config, "base_dir", Path.cwd())
    else:
        path = Path(deploy_config).expanduser().resolve()
        name, doc, base_dir = str(path), load_yaml_file(path), path.parent
        seen.append(path)
    while True:
        if doc is None:
            doc = {}  # an empty file is an empty config
        if not isinstance(doc, Mapping):
            raise ConfigError(
                f"the deploy config must be a mapping, got {type(doc).__name__}",
                source=name,
                hint="write key: value pairs at the top level",
            )
        chain.append((name, doc))
        base = doc.get("base_config")
        if base is None:
            break
        where = (
            f"{name}:{key_line(doc, 'base_config')}"
            if key_line(doc, "base_config")
            else name
        )
        if not isinstance(base, str):
            raise ConfigError(
                "base_config must be a file path", path="base_config", source=where
            )
        path = (base_dir / base).expanduser().resolve()
        if path in seen:
            cycle = " -> ".join(str(p) for p in (*seen, path))
            raise ConfigError(
                f"base_config cycle: {cycle}",
                path="base_config",
                source=where,
                hint="remove the base_config that points back",
            )
        if len(seen) >= MAX_CHAIN:
            raise ConfigError(
                f"base_config chain longer than {MAX_CHAIN} files",
                path="base_config",
                source=where,
            )
        if not path.is_file():
            raise ConfigError(
                f"base_config file not found: {path}",
                path="base_config",
                source=where,
                hint="paths are relative to the file that names them",
            )
        seen.append(path)
        name, doc, base_dir = str(path), load_yaml_file(path), path.parent
    chain.reverse()
    return chain


def deploy_layers(
    deploy_config: str | os.PathLike | Mapping | None, platform: str, out: Collector
) -> list[str]:
    """Ingest the deploy chain (yaml ranks) and each file's ``platforms.<platform>``
    (platform ranks).

    Blocks of other platforms are validated (bad keys are errors everywhere) but
    contribute nothing. Returns the files read, root ancestor first.
    """
    if deploy_config is None:
        return []
    if not isinstance(deploy_config, (str, os.PathLike, Mapping)):
        out.error(
            "deploy_config must be a YAML path or a mapping, got "
            f"{type(deploy_config).__name__}",
            path="deploy_config",
            source="caller",
        )
        return []
    try:
        chain = _load_chain(deploy_config, out)
    except ConfigError as exc:
        out.errors.append(exc)
        return []
    for position, (name, doc) in enumerate(chain):
        ctx = Ctx(out, LAYER_RANK["yaml"] + position, "yaml", name)
        # A server's list of models (config/model_list.py): one config each.
        if "models" in doc:
            out.error(
                "this file lists several models (models:), each its own deploy config",
                path="models",
                source=ctx.src(doc, "models"),
                hint="diffserve serve --deploy-config FILE serves them; "
                "to explain or validate one, give "
                "its entry a file of its own",
            )
            continue
        pipeline_doc(ctx, doc, "", reserved=_DECK_KEYS)
        if "model" in doc:
            folder = Path.cwd() if name == "<dict>" else Path(name).parent
            deploy_model(doc, name, key_line(doc, "model"), folder, out)
        blocks = doc.get("platforms")
        if blocks is None:
            continue
        if not isinstance(blocks, Mapping):
            out.error(
                "platforms must be a mapping of platform name -> overlay",
                path="platforms",
                source=ctx.src(doc, "platforms"),
                hint="write platforms: {cpu: {...}}",
            )
            continue
        seen: set[str] = set()
        for raw_name, block in blocks.items():
            block_source = Source("platform", name, key_line(blocks, raw_name))
            try:
                # CUDA: and hip: name the cuda / rocm blocks.
                block_name = normalize_platform(raw_name)
            except ConfigError:
                out.error(
                    f"unknown platform {raw_name!r}",
                    path=f"platforms.{raw_name}",
                    source=block_source,
                    hint=did_you_mean(raw_name, PLATFORMS)
                    or f"known platforms: {', '.join(PLATFORMS)}",
                )
                continue
            if block_name in seen:
                out.error(
                    f"platform {block_name!r} has two blocks",
                    path=f"platforms.{raw_name}",
                    source=block_source,
                    hint="merge them into one",
                )
                continue
            seen.add(block_name)
            if block is None:
                continue
            if not isinstance(block, Mapping):
                out.error(
                    "a platform overlay must be a mapping",
                    path=f"platforms.{block_name}",
                    source=block_source,
                )
                continue
            active = block_name == platform
            # An inert block is walked into a scratch collector: its errors count, its
            # values do not.
            target = out if active else Collector()
            block_ctx = Ctx(target, LAYER_RANK["platform"] + position, "platform", name)
            pipeline_doc(block_ctx, block, f"platforms.{block_name}")
            if not active:
                out.errors.extend(target.errors)
    return [name for name, _ in chain]


def env_layer(env: Mapping[str, str], out: Collector) -> None:
    """``DIFFSERVE_<FLAT_NAME>`` variables, e.g. DIFFSERVE_LINEAR_BACKEND=torch."""
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        name = var[len(ENV_PREFIX) :]
        if name in NON_CONFIG_ENV:
            continue
        flat = name.lower()
        if flat in FLAT_LEAVES:
            ctx = Ctx(out, LAYER_RANK["env"], "env", detail=var, allow_flat=True)
            pipeline_doc(ctx, {flat: env[var]}, "", stages=False)
            continue
        # Only names close to a field are typos; other DIFFSERVE_* variables may belong
        # to tools.
        hint = did_you_mean(flat, FLAT_LEAVES)
        if hint:
            suggestion = hint.split("'")[1].upper()
            out.error(
                f"unknown config variable {var}",
                path=var,
                source="env",
                hint=f"did you mean {ENV_PREFIX}{suggestion}?",
            )


def caller_layers(
    overrides: Mapping[str, Any] | None,
    stage_overrides: Mapping[Any, Any] | None,
    out: Collector,
) -> None:
    """Caller/CLI values: ``overrides`` apply to every stage, ``stage_overrides`` to one
    stage each.

    Keys are the YAML keys or the flat flag names (``tensor_parallel_size``); None means
    "not given".
    """
    if overrides is not None:
        if not isinstance(overrides, Mapping):
            out.error("overrides must be a mapping", path="overrides", source="cli")
        else:
            pipeline_doc(
                Ctx(out, LAYER_RANK["cli"], "cli", allow_flat=True),
                overrides,
                "",
                stages=False,
            )
    if stage_overrides is None:
        return
    if not isinstance(stage_overrides, Mapping):
        out.error(
            "stage_overrides must map stage_id -> {field: value}",
            path="stage_overrides",
            source="cli_stage",
            hint='e.g. {"0": {"linear_backend": "torch"}}',
        )
        return
    for raw_id, body in stage_overrides.items():
        source = Source("cli_stage", detail=f"stage_overrides[{raw_id!r}]")
        try:
            stage_id = stage_id_of(raw_id)
        except ConfigError as exc:
            out.fail(exc, path=f"stage_overrides.{raw_id}", source=source)
            continue
        if not isinstance(body, Mapping):
            out.error(
                "expected a mapping of field -> value",
                path=f"stage_overrides.{stage_id}",
                source=source,
            )
            continue
        ctx = Ctx(out, LAYER_RANK["cli_stage"], "cli_stage", allow_flat=True)
        if stage_id in out.ar_stage_ids:  # an AR stage the deploy file declared
            ar_stage_mapping(ctx, body, stage_id, f"stage_overrides.{stage_id}")
            continue
        out.stage_refs.append(StageRef(stage_id, source, f"stage_overrides.{stage_id}"))
        stage_mapping(ctx, body, stage_id, f"stage_overrides.{stage_id}")
