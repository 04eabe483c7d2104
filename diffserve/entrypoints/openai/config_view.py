"""The body of ``GET /v1/config``: the resolved config's values with where each one came from."""

from __future__ import annotations

import dataclasses
import json
from typing import Any


def config_view(cfg: Any) -> dict[str, Any]:
    """Prefer the config package's own JSON rendering; fall back to a plain dump of the dataclass."""
    try:
        from diffserve.config import explain
    except ImportError:  # pragma: no cover - the config package always ships explain.py
        explain = None
    for name in ("explain_json", "to_json_dict", "as_json"):
        render = getattr(explain, name, None)
        if callable(render):
            out = render(cfg)
            return json.loads(out) if isinstance(out, str) else out
    provenance = getattr(cfg, "provenance", {}) or {}
    return {
        "fingerprint": getattr(cfg, "fingerprint", None),
        "config": _plain(cfg),
        "provenance": {k: _source(v) for k, v in provenance.items()},
        "warnings": list(getattr(cfg, "warnings", ()) or ()),
    }


def _source(src: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(src):
        return {k: v for k, v in dataclasses.asdict(src).items() if v is not None}
    return {"layer": str(src)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in ("provenance", "warnings")}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
