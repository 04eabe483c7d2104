"""The body of ``GET /v1/config``: the resolved config's values with where each one came
from.

Unless ``server.expose_config`` is on, what would tell a client about the host is
redacted: absolute paths (the model directory, deploy files, provenance locations, paths
inside warnings) keep only their last component, and ``extras`` values (free-form,
possibly secrets) are replaced by a marker. A password in ``server.job_store``'s URL is
replaced by the marker always.
"""

from __future__ import annotations

import os
import re
from typing import Any

REDACTED = "<redacted>"
# An absolute POSIX path, a home-relative one, or a Windows drive path; up to a quote,
# space or comma.
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)\S*@")
_PATH = re.compile(r"(?:(?<![\w.])~|\b[A-Za-z]:)?(?:[/\\][^\s'\",;()\[\]{}]+)+")


def config_view(cfg: Any, *, expose: bool = False) -> dict[str, Any]:
    """The same document as ``diffserve config explain --json`` (one renderer, owned by
    config), redacted unless ``expose``."""
    from diffserve.config.explain import explain_dict

    doc = explain_dict(cfg)
    store = doc.get("pipeline", {}).get("server.job_store")
    # A database password never leaves, exposed or not.
    if store and isinstance(store.get("value"), str):
        store["value"] = _URL_PASSWORD.sub(r"\1" + REDACTED + "@", store["value"])
    if expose:
        return doc
    doc["model"] = _basename(doc.get("model"))
    source = doc.get("model_source")
    # A hub id's repository, revision and commit are public; local paths are not.
    if source:
        for key in ("given", "path", "location"):
            if isinstance(source.get(key), str):
                source[key] = redact_paths(source[key])
    doc["deploy_files"] = [_basename(path) for path in doc.get("deploy_files", [])]
    doc["warnings"] = [redact_paths(str(w)) for w in doc.get("warnings", [])]
    _redact_fields(doc.get("pipeline", {}))
    for stage in doc.get("stages", []):
        _redact_fields(stage.get("fields", {}))
    return doc


def redact_paths(text: str) -> str:
    """Every path in ``text`` shortened to ``…/<last component>``."""
    return _PATH.sub(lambda m: ".../" + _last(m.group(0)), text)


def _redact_fields(fields: dict[str, Any]) -> None:
    for key, entry in fields.items():
        if key.startswith("extras.") or key == "extras":
            entry["value"] = REDACTED
        elif isinstance(entry.get("value"), str):
            entry["value"] = redact_paths(entry["value"])
        if isinstance(entry.get("location"), str):
            entry["location"] = redact_paths(entry["location"])


def _basename(path: Any) -> Any:
    return _last(path) if isinstance(path, str) and path else path


def _last(path: str) -> str:
    return os.path.basename(path.rstrip("/\\")) or path
