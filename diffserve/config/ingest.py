"""Walk one config document (a YAML file, a platform block, caller overrides) into
assignments.

This is the ingress: every key is checked against the schema (unknown keys are errors
with a "did you mean"), every value is canonicalized by its field's normalizer, and
every value is recorded with its source. Errors are collected, not raised, so ``config
validate`` can report all of them.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diffserve.config.fields import (
    FLAT_LEAVES,
    PIPELINE_LEAVES,
    SECTIONS,
    STAGE_KEYS,
    STAGE_LEAVES,
    TOP_LEVEL_PIPELINE_LEAVES,
    Leaf,
    did_you_mean,
)
from diffserve.config.ingest_context import Ctx
from diffserve.config.provenance import Source
from diffserve.config.schema import FrozenDict
from diffserve.config.stage_sections import ATTENTION_ROLES
from diffserve.errors import ConfigError

_MAX_DEPTH = 32
PIPELINE_ONLY = (*TOP_LEVEL_PIPELINE_LEAVES, "server")


def join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def is_key(ctx: Ctx, mapping: Mapping, key: Any, path: str) -> bool:
    if isinstance(key, str):
        return True
    ctx.out.error(
        f"key {key!r} is not a string",
        path=path or None,
        source=ctx.src(mapping, key),
        hint="keys are field names like dtype; quote numbers",
    )
    return False


def _mapping(ctx: Ctx, value: Any, path: str, source: Source) -> Mapping | None:
    if isinstance(value, Mapping):
        return value
    ctx.out.error(
        f"expected a mapping, got {type(value).__name__} {value!r}",
        path=path,
        source=source,
        hint=f"write {path.rsplit('.', 1)[-1]}: {{key: value, ...}}",
    )
    return None


def _unknown(
    ctx: Ctx,
    key: str,
    path: str,
    source: Source,
    valid: tuple[str, ...] | list[str],
    extra_hint: str | None = None,
) -> None:
    hint = (
        extra_hint
        or did_you_mean(key, valid)
        or f"valid keys: {', '.join(sorted(set(valid)))}"
    )
    ctx.out.error(
        f"unknown key {key!r}", path=join(path, key), source=source, hint=hint
    )


# Leaves whose values are {name: file path}: a relative path in a deploy file is
# relative to that file, as ``model:`` and ``base_config`` are (elsewhere, to the
# working directory).
_FILE_MAPPINGS = frozenset({"lora_modules", "components"})


def leaf(
    ctx: Ctx, leaf: Leaf, value: Any, stage_id: int | None, path: str, source: Source
) -> None:
    if (
        leaf.key in _FILE_MAPPINGS
        and ctx.file is not None
        and ctx.file != "<dict>"
        and isinstance(value, Mapping)
    ):
        folder = Path(ctx.file).parent
        value = {
            k: str(folder / os.path.expanduser(v))
            if isinstance(v, str)
            and v.strip()
            and not os.path.isabs(os.path.expanduser(v))
            else v
            for k, v in value.items()
        }
    try:
        canonical = leaf.normalize(value)
    except ConfigError as exc:
        ctx.out.fail(exc, path=path, source=source)
        return
    ctx.out.add(ctx.rank, stage_id, leaf.key, canonical, source)


def _attention(
    ctx: Ctx, value: Any, stage_id: int | None, path: str, source: Source
) -> None:
    """A plain name sets every role; a mapping sets ``default`` and/or named roles."""
    normalize = STAGE_LEAVES["attention_backend"].normalize
    if not isinstance(value, Mapping):
        try:
            name = normalize(value)
        except ConfigError as exc:
            ctx.out.fail(exc, path=path, source=source)
            return
        for part in ("default", *ATTENTION_ROLES):
            ctx.out.add(ctx.rank, stage_id, f"attention_backend.{part}", name, source)
        return
    for role, name in value.items():
        if not is_key(ctx, value, role, path):
            continue
        sub_source = ctx.src(value, role) if ctx.file else source
        if role not in ("default", *ATTENTION_ROLES):
            _unknown(ctx, role, path, sub_source, ("default", *ATTENTION_ROLES))
            continue
        if name is None:
            continue
        try:
            ctx.out.add(
                ctx.rank,
                stage_id,
                f"attention_backend.{role}",
                normalize(name),
                sub_source,
            )
        except ConfigError as exc:
            ctx.out.fail(exc, path=join(path, role), source=sub_source)


def freeze(value: Any, path: str, depth: int = 0) -> Any:
    """Deep-copy an extras value into read-only JSON-like data (mappings, tuples,
    scalars)."""
    if depth > _MAX_DEPTH:
        raise ConfigError("extras nest too deep (or refer to themselves)", path=path)
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise ConfigError(
                    f"extras key {key!r} is not a string", path=path, hint="quote it"
                )
        return FrozenDict(
            {k: freeze(v, join(path, k), depth + 1) for k, v in value.items()}
        )
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
    raise ConfigError(
        f"extras value of type {type(value).__name__} is not plain data",
        path=path,
        hint="use strings, numbers, booleans, lists and mappings",
    )


def _extras(
    ctx: Ctx, value: Any, stage_id: int | None, path: str, source: Source
) -> None:
    extras = _mapping(ctx, value, path, source) or {}
    for key, item in extras.items():
        if not is_key(ctx, extras, key, path):
            continue
        sub_source = ctx.src(extras, key) if ctx.file else source
        try:
            ctx.out.add(
                ctx.rank,
                stage_id,
                f"extras.{key}",
                freeze(item, join(path, key)),
                sub_source,
            )
        except ConfigError as exc:
            ctx.out.fail(exc, path=exc.path, source=sub_source)


def section(
    ctx: Ctx, name: str, value: Any, stage_id: int | None, path: str, source: Source
) -> None:
    _section_body(ctx, SECTIONS[name], value, stage_id, path, source)


def _section_body(
    ctx: Ctx,
    leaves: Mapping[str, Leaf],
    value: Any,
    stage_id: int | None,
    path: str,
    source: Source,
) -> None:
    """A section's mapping; ``leaves`` are keyed relative to it, so a nested section
    (``server.autoscaling``) is the leaves under ``autoscaling.``, walked the same
    way."""
    body = _mapping(ctx, value, path, source) or {}
    nested = {key.split(".", 1)[0] for key in leaves if "." in key}
    for key, item in body.items():
        if not is_key(ctx, body, key, path):
            continue
        sub_source = ctx.src(body, key) if ctx.file else source
        if key in leaves:
            if item is not None:
                leaf(ctx, leaves[key], item, stage_id, join(path, key), sub_source)
        elif key in nested:
            if item is not None:
                inner = {
                    k.split(".", 1)[1]: leaf
                    for k, leaf in leaves.items()
                    if k.startswith(f"{key}.")
                }
                _section_body(ctx, inner, item, stage_id, join(path, key), sub_source)
        else:
            _unknown(
                ctx, key, path, sub_source, sorted({k.split(".", 1)[0] for k in leaves})
            )


def stage_field(
    ctx: Ctx,
    mapping: Mapping,
    key: str,
    value: Any,
    stage_id: int | None,
    path: str,
    valid: list[str],
) -> None:
    """One key of a stage mapping (or a pipeline-wide stage field). ``valid`` feeds
    did-you-mean."""
    source = ctx.src(mapping, key)
    full = join(path, key)
    if value is None:
        return  # null means "no opinion", same as leaving the key out
    if key == "attention_backend":
        _attention(ctx, value, stage_id, full, source)
    elif key == "extras":
        _extras(ctx, value, stage_id, full, source)
    elif key in SECTIONS and key != "server":
        section(ctx, key, value, stage_id, full, source)
    elif key in STAGE_LEAVES:
        leaf(ctx, STAGE_LEAVES[key], value, stage_id, full, source)
    elif ctx.allow_flat and key in FLAT_LEAVES and FLAT_LEAVES[key].scope == "stage":
        leaf(ctx, FLAT_LEAVES[key], value, stage_id, full, source)
    elif key in ("stage_id", "role", "stages"):
        hint = {
            "stage_id": "stage_id belongs inside a stages: entry",
            "role": "role is fixed by the topology; set topology: instead",
            "stages": "per-stage caller values go in stage_overrides={stage_id: {...}}",
        }[key]
        _unknown(ctx, key, path, source, valid, hint)
    elif stage_id is not None and (
        key in PIPELINE_ONLY
        or key in PIPELINE_LEAVES
        or (key in FLAT_LEAVES and FLAT_LEAVES[key].scope == "pipeline")
    ):
        _unknown(
            ctx,
            key,
            path,
            source,
            valid,
            f"{key} is pipeline-wide only; set it for the whole pipeline",
        )
    else:
        hint = None
        if key in FLAT_LEAVES and FLAT_LEAVES[key].section:
            # Server.autoscaling.min_replicas: two mappings.
            *outer, last = FLAT_LEAVES[key].key.split(".")
            hint = (
                "write it as "
                + "".join(f"{name}: {{" for name in outer)
                + f"{last}: ..."
                + "}" * len(outer)
            )
        _unknown(ctx, key, path, source, valid, hint)


def stage_mapping(
    ctx: Ctx, body: Mapping, stage_id: int, path: str, skip: tuple[str, ...] = ()
) -> None:
    """Every field of one stage entry (``stage_id`` itself is read by the caller)."""
    valid = [*STAGE_KEYS, "stage_id"] + (list(FLAT_LEAVES) if ctx.allow_flat else [])
    for key, value in body.items():
        if key in skip or not is_key(ctx, body, key, path):
            continue
        stage_field(ctx, body, key, value, stage_id, path, valid)
