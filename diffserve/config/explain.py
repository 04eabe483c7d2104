"""Show the work: every effective value with its source, and the fingerprint of the
effective values."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from diffserve.config.flatten import flatten_ar_stage, flatten_server, flatten_stage

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig


def _canonical(resolved: ResolvedConfig) -> dict[str, Any]:
    return {
        "model": resolved.model,
        "platform": resolved.platform,
        "topology": resolved.topology,
        "ray_address": resolved.ray_address,
        **flatten_server(resolved.server),
        "stages": [
            {"stage_id": s.stage_id, **flatten_stage(s)} for s in resolved.stages
        ],
        # Only when there are AR stages: a deployment without one keeps the fingerprint
        # it always had.
        **(
            {
                "ar_stages": [
                    {"stage_id": s.stage_id, **flatten_ar_stage(s)}
                    for s in resolved.ar_stages
                ]
            }
            if resolved.ar_stages
            else {}
        ),
    }


def fingerprint_of(resolved: ResolvedConfig) -> str:
    """Hash of the canonical effective values; provenance, warnings and key order do not
    count."""
    text = json.dumps(
        _canonical(resolved), sort_keys=True, separators=(",", ":"), default=repr
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _entry(resolved: ResolvedConfig, key: str, value: Any) -> dict[str, Any]:
    source = resolved.source_of(key)
    return {"value": value, "source": source.layer, "location": source.location}


def explain_dict(resolved: ResolvedConfig) -> dict[str, Any]:
    """The ``diffserve config explain --json`` document."""
    pipeline = {
        "topology": _entry(resolved, "topology", resolved.topology),
        "ray_address": _entry(resolved, "ray_address", resolved.ray_address),
    }
    pipeline.update(
        {k: _entry(resolved, k, v) for k, v in flatten_server(resolved.server).items()}
    )
    stages = []
    for ar in resolved.ar_stages:  # they run first, with their own keys (kind: ar)
        stages.append(
            {
                "stage_id": ar.stage_id,
                "kind": "ar",
                "fields": {
                    key: _entry(resolved, f"stages.{ar.stage_id}.{key}", value)
                    for key, value in flatten_ar_stage(ar).items()
                    if key != "kind"
                },
            }
        )
    for stage in resolved.stages:
        fields = {}
        for key, value in flatten_stage(stage).items():
            # role is decided by the topology, so it shares the topology's source.
            prov_key = "topology" if key == "role" else f"stages.{stage.stage_id}.{key}"
            fields[key] = _entry(resolved, prov_key, value)
        stages.append({"stage_id": stage.stage_id, "fields": fields})
    return {
        "fingerprint": resolved.fingerprint,
        "model": resolved.model,
        "model_source": resolved.model_source.describe()
        if resolved.model_source
        else None,
        "platform": resolved.platform,
        "deploy_files": list(resolved.deploy_files),
        "pipeline": pipeline,
        "stages": stages,
        "warnings": list(resolved.warnings),
    }


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=repr)


def render_table(resolved: ResolvedConfig) -> str:
    """A readable table: stage, key, value, source, location (one row per effective
    value)."""
    doc = explain_dict(resolved)
    rows = [("stage", "key", "value", "source", "location")]
    entries = [("-", "", doc["pipeline"])] + [
        (str(s["stage_id"]), f"stages.{s['stage_id']}.", s["fields"])
        for s in doc["stages"]
    ]
    for stage, prefix, fields in entries:
        for key, entry in fields.items():
            # Env and caller values have no file; show the variable or key they came
            # from instead.
            where = (
                entry["location"]
                or resolved.source_of(
                    "topology" if key == "role" else prefix + key
                ).detail
            )
            rows.append(
                (stage, key, _show(entry["value"]), entry["source"], where or "")
            )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"platform: {resolved.platform}   fingerprint: {resolved.fingerprint}"]
    for row in rows:
        lines.append(
            "  ".join(
                cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)
            ).rstrip()
        )
    lines.extend(f"warning: {w}" for w in resolved.warnings)
    return "\n".join(lines)
