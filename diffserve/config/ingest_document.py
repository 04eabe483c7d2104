"""A deploy document's top level: the pipeline-only keys, the pipeline-wide stage
fields and the ``stages`` list (each entry's id checked, its fields walked by
``ingest.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diffserve.config.ar_ingest import AR_KIND, ar_stage_mapping, stage_kind
from diffserve.config.fields import FLAT_LEAVES, STAGE_KEYS, TOP_LEVEL_PIPELINE_LEAVES
from diffserve.config.ingest import (
    PIPELINE_ONLY,
    is_key,
    join,
    leaf,
    section,
    stage_field,
    stage_mapping,
)
from diffserve.config.ingest_context import Ctx
from diffserve.config.provenance import Source, StageRef
from diffserve.errors import ConfigError


def stage_id_of(value: Any) -> int:
    """A stage id: a non-negative int, or its decimal text (JSON object keys are
    strings)."""
    # isascii: str.isdigit() also accepts superscripts and other digits that int()
    # refuses ("²").
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1000:
        return value
    raise ConfigError(f"stage_id {value!r} is not a stage number", hint="use 0, 1, ...")


def stages_list(ctx: Ctx, value: Any, path: str, source: Source) -> None:
    """``stages: [{stage_id: 0, ...}, ...]``; entries are matched to the topology by
    stage_id."""
    if not isinstance(value, list):
        ctx.out.error(
            f"expected a list of stage entries, got {type(value).__name__}",
            path=path,
            source=source,
            hint="write stages: [{stage_id: 0, ...}]",
        )
        return
    seen: dict[int, int] = {}
    for index, entry in enumerate(value):
        entry_path = f"{path}[{index}]"
        entry_source = Source(
            ctx.layer, ctx.file, getattr(entry, "line", None), ctx.detail
        )
        if not isinstance(entry, Mapping):
            ctx.out.error(
                f"stage entry must be a mapping, got {type(entry).__name__}",
                path=entry_path,
                source=entry_source,
                hint="write - {stage_id: 0, dtype: ...}",
            )
            continue
        if entry.get("stage_id") is None:
            ctx.out.error(
                "stage entry has no stage_id",
                path=entry_path,
                source=entry_source,
                hint="add stage_id: 0 (or the stage it configures)",
            )
            continue
        id_source = ctx.src(entry, "stage_id")
        try:
            stage_id = stage_id_of(entry["stage_id"])
        except ConfigError as exc:
            ctx.out.fail(exc, path=f"{entry_path}.stage_id", source=id_source)
            continue
        if stage_id in seen:
            ctx.out.error(
                f"stage_id {stage_id} appears twice (entries {seen[stage_id]} "
                f"and {index})",
                path=entry_path,
                source=id_source,
                hint="merge the two entries",
            )
            continue
        seen[stage_id] = index
        kind = stage_kind(ctx, entry, stage_id, entry_path)
        if kind == AR_KIND:
            ar_stage_mapping(ctx, entry, stage_id, f"{path}[stage_id={stage_id}]")
        elif kind is not None:
            ctx.out.stage_refs.append(
                StageRef(stage_id, id_source, f"{entry_path}.stage_id")
            )
            stage_mapping(
                ctx,
                entry,
                stage_id,
                f"{path}[stage_id={stage_id}]",
                skip=("stage_id", "kind"),
            )


def pipeline_doc(
    ctx: Ctx,
    doc: Mapping,
    path: str,
    *,
    reserved: tuple[str, ...] = (),
    stages: bool = True,
) -> None:
    """A top-level document: pipeline-only keys, pipeline-wide stage fields and
    ``stages``.

    ``reserved`` keys are accepted but handled by the caller (``base_config``,
    ``platforms``).
    """
    valid = [*PIPELINE_ONLY, *STAGE_KEYS, *reserved] + (["stages"] if stages else [])
    if ctx.allow_flat:
        valid += list(FLAT_LEAVES)
    for key, value in doc.items():
        if not is_key(ctx, doc, key, path) or key in reserved or value is None:
            continue
        source = ctx.src(doc, key)
        if key in TOP_LEVEL_PIPELINE_LEAVES:
            leaf(
                ctx,
                TOP_LEVEL_PIPELINE_LEAVES[key],
                value,
                None,
                join(path, key),
                source,
            )
        elif key == "server":
            section(ctx, "server", value, None, join(path, key), source)
        elif key == "stages" and stages:
            stages_list(ctx, value, join(path, key), source)
        elif (
            ctx.allow_flat
            and key in FLAT_LEAVES
            and FLAT_LEAVES[key].scope == "pipeline"
        ):
            leaf(ctx, FLAT_LEAVES[key], value, None, join(path, key), source)
        else:
            stage_field(ctx, doc, key, value, None, path, valid)
