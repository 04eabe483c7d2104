"""Ingest of an AR stage's entry (``kind: ar``): diffserve's keys
(``ar_schema.AR_KEYS``) and vLLM's flat engine settings, each checked, canonicalized and
recorded with its source as ``ar.<key>`` of that stage.

Which stage ids are AR is known from the first document that says ``kind: ar`` for them
(documents are walked root ``base_config`` first, then the file, its ``platforms:``
block and the caller), so an overlay or a caller's ``stage_overrides`` for that stage
need not repeat the kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diffserve.config.ar_schema import (
    AR_KEYS,
    OWNED_ENGINE_ARGS,
    VLLM_KEYS,
    plain_data,
    sampling_value,
)
from diffserve.config.fields import did_you_mean
from diffserve.config.ingest_context import Ctx
from diffserve.config.provenance import Source
from diffserve.config.vllm_args import engine_arg_names, sampling_param_names
from diffserve.errors import ConfigError

AR_KIND = "ar"
STAGE_KINDS = ("diffusion", AR_KIND)
_PREFIX = "ar."


def ar_key(key: str) -> str:
    """The assignment key of an AR stage setting."""
    return _PREFIX + key


def is_ar_key(key: str) -> bool:
    return key.startswith(_PREFIX)


def ar_stage_mapping(ctx: Ctx, body: Mapping, stage_id: int, path: str) -> None:
    """Every key of one AR stage entry (``stage_id`` and ``kind`` are read by the
    caller)."""
    vllm_missing = False
    for key, value in body.items():
        if key in ("stage_id", "kind") or value is None:
            continue
        source = ctx.src(body, key)
        full = f"{path}.{key}"
        if not isinstance(key, str):
            ctx.out.error(
                f"key {key!r} is not a string",
                path=path,
                source=source,
                hint="quote it",
            )
            continue
        try:
            if key in AR_KEYS:
                value = _own_value(ctx, key, value, full, source)
                if value is None:
                    continue
            elif key in OWNED_ENGINE_ARGS:
                ctx.out.error(
                    f"{key} is set by diffserve on an ar stage",
                    path=full,
                    source=source,
                    hint=OWNED_ENGINE_ARGS[key],
                )
                continue
            else:
                if vllm_missing:
                    continue
                names = engine_arg_names()
                if key not in names:
                    hint = did_you_mean(key, [*AR_KEYS, *names]) or (
                        "an ar stage takes diffserve's keys ("
                        + ", ".join(AR_KEYS)
                        + ") and vLLM's EngineArgs fields"
                    )
                    ctx.out.error(
                        f"unknown key {key!r} (neither an ar stage key nor a "
                        "vLLM EngineArgs field)",
                        path=full,
                        source=source,
                        hint=hint,
                    )
                    continue
                value = (
                    VLLM_KEYS[key](value)
                    if key in VLLM_KEYS
                    else plain_data(value, key)
                )
        except ConfigError as exc:
            if exc.hint and "diffserve[ar]" in exc.hint:
                vllm_missing = True  # said once per stage, not once per key
            ctx.out.fail(exc, path=full, source=source)
            continue
        ctx.out.add(ctx.rank, stage_id, ar_key(key), value, source)


def _own_value(ctx: Ctx, key: str, value: Any, path: str, source: Source) -> Any:
    normalize = AR_KEYS[key][0]
    canonical = normalize(value)
    if key == "default_sampling_params":
        names = sampling_param_names()
        checked = {}
        for name, item in canonical.items():
            if name not in names:
                ctx.out.error(
                    f"unknown sampling parameter {name!r}",
                    path=f"{path}.{name}",
                    source=source,
                    hint=did_you_mean(name, names) or "use vLLM SamplingParams fields",
                )
                continue
            try:
                checked[name] = sampling_value(name, item)
            except ConfigError as exc:
                ctx.out.fail(exc, path=f"{path}.{name}", source=source)
        return normalize(checked)
    if key == "model" and ctx.file is not None and ctx.file != "<dict>":
        local = Path(canonical).expanduser()
        folder = Path(ctx.file).parent
        if not local.is_absolute() and (folder / local).exists():
            return str((folder / local).resolve())
    return canonical


def stage_kind(ctx: Ctx, entry: Mapping, stage_id: int, path: str) -> str | None:
    """``diffusion`` or ``ar`` for one ``stages:`` entry (None after an error): its
    ``kind`` if written, else what an earlier document declared for that stage id."""
    kind = entry.get("kind")
    if kind is None:
        return AR_KIND if stage_id in ctx.out.ar_stage_ids else "diffusion"
    if kind not in STAGE_KINDS:
        ctx.out.error(
            f"stage kind {kind!r} is not one of {', '.join(STAGE_KINDS)}",
            path=f"{path}.kind",
            source=ctx.src(entry, "kind"),
            hint="write kind: ar for an LLM stage (diffusion stages omit it)",
        )
        return None
    if kind == "diffusion" and stage_id in ctx.out.ar_stage_ids:
        ctx.out.error(
            f"stage {stage_id} is an ar stage in an earlier document",
            path=f"{path}.kind",
            source=ctx.src(entry, "kind"),
            hint="give the diffusion stage another stage_id",
        )
        return None
    if kind == AR_KIND:
        ctx.out.ar_stage_ids.add(stage_id)
    return kind
