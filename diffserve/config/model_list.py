"""Several models on one server: ``diffserve serve MODEL [MODEL ...]``, or a deploy
file's ``models:`` list.

Each model gets its own deploy config and so its own stages, replicas and defaults,
resolved on its own by ``resolve``. A ``models:`` entry is a deploy config written
inline (a mapping; its ``model:`` and ``base_config`` paths are relative to the file,
its errors cite the file's lines) or the path of a deploy file; its optional ``name:``
is the id clients send (default: the model folder's name or hub id). A file with
``models:`` holds nothing else: the server-wide settings (``server.*``) are the first
entry's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffserve.config.yaml_lines import LineDict, key_line, load_yaml_file
from diffserve.errors import ConfigError

MODELS_KEY = "models"


class DeployEntry(LineDict):
    """One inline ``models:`` entry as a deploy config: it keeps its lines and cites the
    file it came from."""

    def __init__(
        self, entry: Mapping[str, Any], source_name: str, base_dir: Path
    ) -> None:
        super().__init__(entry)
        self.lines = dict(getattr(entry, "lines", {}))
        self.line = getattr(entry, "line", None)
        self.source_name = source_name
        self.base_dir = base_dir


@dataclass(frozen=True)
class ModelEntry:
    """What ``resolve`` gets for one served model, and the id clients use for it (None:
    derived from the model)."""

    model: str | None
    deploy_config: str | os.PathLike[str] | Mapping[str, Any] | None
    name: str | None = None


def model_entries(
    models: Sequence[str], deploy_config: str | os.PathLike[str] | None
) -> list[ModelEntry]:
    """One entry per model to serve: the command line's MODELs (each with the same
    deploy file), or the deploy file's ``models:`` list, or the one model of the deploy
    file (or the demo: ``model`` None)."""
    listed = _listed(Path(deploy_config)) if deploy_config is not None else None
    if listed is None:
        if not models:
            return [ModelEntry(None, deploy_config)]
        return [ModelEntry(model, deploy_config) for model in models]
    if models:
        raise ConfigError(
            f"{deploy_config} lists its models (models:) and the command line names "
            f"{', '.join(models)}",
            path="models",
            hint="name the models in one place: drop MODEL or the file's models: list",
        )
    return listed


def _listed(path: Path) -> list[ModelEntry] | None:
    path = path.expanduser().resolve()
    doc = load_yaml_file(path) if path.is_file() else None
    if not isinstance(doc, Mapping) or MODELS_KEY not in doc:
        return None  # resolve reports a missing or malformed file
    where = (
        f"{path}:{key_line(doc, MODELS_KEY)}"
        if key_line(doc, MODELS_KEY)
        else str(path)
    )
    others = sorted(str(key) for key in doc if key != MODELS_KEY)
    if others:
        raise ConfigError(
            "a file with models: holds nothing else, but it also "
            f"sets {', '.join(others)}",
            path=others[0],
            source=where,
            hint="move those keys into the entries (server.* settings "
            "into the first entry)",
        )
    entries = doc[MODELS_KEY]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            "models must be a non-empty list of deploy configs "
            "(mappings) or deploy file paths",
            path=MODELS_KEY,
            source=where,
            hint="write models: [{model: ./a}, {model: ./b}]",
        )
    return [_entry(entry, index, path, where) for index, entry in enumerate(entries)]


def _entry(entry: Any, index: int, path: Path, where: str) -> ModelEntry:
    key = f"{MODELS_KEY}.{index}"
    if isinstance(entry, str):
        file = (path.parent / entry).expanduser().resolve()
        if not file.is_file():
            raise ConfigError(
                f"deploy file not found: {file}",
                path=key,
                source=where,
                hint="paths are relative to the file that names them",
            )
        return ModelEntry(None, str(file))
    if not isinstance(entry, Mapping):
        raise ConfigError(
            "an entry of models must be a mapping or a file path, "
            f"got {type(entry).__name__}",
            path=key,
            source=where,
        )
    name = entry.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigError(
            "name must be a non-empty string (the model id clients send)",
            path=f"{key}.name",
            source=where,
        )
    body = {k: v for k, v in entry.items() if k != "name"}
    return ModelEntry(None, DeployEntry(body, str(path), path.parent), name)
