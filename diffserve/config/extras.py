"""The extras-vs-typed-field rule.

``extras`` is the one free-form bag. A key in it that names a typed field is compared
with the typed field's effective value, both canonical: equal values are folded away
silently (``TORCH`` in extras vs ``torch`` typed is not a conflict); different values
give exactly one warning naming both values and the winner, which is always the typed
field.
"""

from __future__ import annotations

from typing import Any

from diffserve.config.fields import FLAT_LEAVES, SECTIONS, STAGE_LEAVES
from diffserve.config.ingest import Ctx, stage_field
from diffserve.config.provenance import Collector, Source
from diffserve.config.stage_sections import ATTENTION_ROLES


def names_typed_field(name: str) -> bool:
    leaf = FLAT_LEAVES.get(name)
    return (
        name in STAGE_LEAVES
        or (name in SECTIONS and name != "server")
        or (leaf is not None and leaf.scope == "stage")
    )


def _effective(values: dict[str, Any], key: str) -> Any:
    # A role nobody set runs the default backend; compare against that.
    role = key.removeprefix("attention_backend.")
    if role in ATTENTION_ROLES and key not in values:
        return values["attention_backend.default"]
    return values[key]


def fold_extras(
    stage_id: int,
    values: dict[str, Any],
    sources: dict[str, Source],
    out: Collector,
    warnings: list[str],
) -> None:
    """Remove extras keys that name typed fields from ``values``/``sources``, warning on
    conflict."""
    for key in [k for k in values if k.startswith("extras.")]:
        name = key.removeprefix("extras.")
        if not names_typed_field(name):
            continue
        extra_source = sources.pop(key)
        raw = values.pop(key)
        scratch = Collector()
        ctx = Ctx(
            scratch,
            0,
            extra_source.layer,
            extra_source.file,
            extra_source.detail,
            allow_flat=True,
        )
        stage_field(
            ctx, {name: raw}, name, raw, stage_id, f"stages[{stage_id}].extras", []
        )
        for error in scratch.errors:
            out.error(
                f"extras.{name} names a typed field but its value is "
                f"invalid: {error.rule}",
                path=f"stages[{stage_id}].extras.{name}",
                source=extra_source,
                hint=error.hint,
            )
        clashes = [
            (a.key, a.value, _effective(values, a.key))
            for a in scratch.assignments
            if a.value != _effective(values, a.key)
        ]
        if not clashes:
            continue
        typed_source = sources.get(clashes[0][0]) or sources.get(
            "attention_backend.default"
        )
        typed_where = typed_source.describe() if typed_source else "default"
        ours = ", ".join(f"{k}={v!r}" for k, v, _ in clashes)
        theirs = ", ".join(f"{k}={t!r}" for k, _, t in clashes)
        warnings.append(
            f"stage {stage_id}: extras.{name} ({extra_source.describe()}) "
            f"says {ours} but the typed field "
            f"says {theirs} ({typed_where}); using {theirs} (the typed field wins). "
            f"Remove extras.{name} or set the typed field instead."
        )
