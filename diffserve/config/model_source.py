"""Where the model comes from: the caller's ``model`` (``Engine(model)``, ``serve
MODEL``) or the deploy file's ``model:``, as a local diffusers directory or a hub id
resolved to a snapshot in the Hugging Face cache.

The caller's value wins over the deploy file's (as every caller value does); a relative
path written in a deploy file is read from that file's folder. The result remembers what
was written, where, and for a hub id the repository, revision and commit: ``config
explain`` shows it and the attestation carries it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffserve.config.hub import parse_hub_id, resolve_hub_model
from diffserve.config.provenance import Collector, Source
from diffserve.errors import ConfigError


@dataclass(frozen=True)
class ModelSource:
    """The model as given (``given``, from ``origin``) and the local directory it
    resolved to."""

    given: str
    origin: Source
    path: str
    # A hub id's repository, the revision asked for and the commit it named ("" for a
    # local directory).
    repo_id: str = ""
    revision: str = ""
    commit: str = ""

    @property
    def kind(self) -> str:
        return "hub" if self.repo_id else "directory"

    def describe(self) -> dict[str, str]:
        """What ``config explain`` and the attestation show."""
        shown = {
            "kind": self.kind,
            "given": self.given,
            "path": self.path,
            "source": self.origin.layer,
            "location": self.origin.describe(),
        }
        if self.repo_id:
            shown.update(
                repo_id=self.repo_id, revision=self.revision, commit=self.commit
            )
        return shown


def deploy_model(
    doc: Any, name: str, line: int | None, base_dir: Path, out: Collector
) -> None:
    """Record a deploy file's ``model:`` (a later file in the base_config chain replaces
    an earlier one's)."""
    value = doc.get("model") if hasattr(doc, "get") else None
    if value is None:
        return
    source = Source("yaml", name, line, "model")
    if not isinstance(value, str) or not value.strip():
        out.error(
            "model must be a directory path or a hub id (org/name[@revision])",
            path="model",
            source=source,
        )
        return
    text = value.strip()
    local = Path(text).expanduser()
    if not local.is_absolute() and (base_dir / local).exists():
        text = str(base_dir / local)
    out.deploy_model = (text, source)


def locate_model(model: str | os.PathLike | None, out: Collector) -> ModelSource | None:
    """The caller's model, else the deploy file's; a hub id becomes its snapshot folder.
    Errors go to ``out``."""
    if model is not None and not isinstance(model, (str, os.PathLike)):
        out.error(
            f"model must be a directory path or a hub id, got {type(model).__name__}",
            path="model",
            source="caller",
        )
        return None
    if model is not None:
        given, origin = os.fspath(model), Source("caller", None, None, "model")
    elif out.deploy_model is not None:
        given, origin = out.deploy_model
    else:
        return None
    path = Path(given).expanduser()
    hub_id = parse_hub_id(given)
    if path.exists() or hub_id is None:
        # Model_layer reports a missing or non-model folder.
        return ModelSource(given, origin, str(path.resolve()))
    from_files = {
        name
        for item in out.assignments
        if item.key == "components" and isinstance(item.value, Mapping)
        for name in item.value
    }
    try:
        snapshot = resolve_hub_model(given, skip_weights_of=from_files)
    except ConfigError as exc:
        out.errors.append(exc)
        return None
    except (
        Exception
    ) as exc:  # the hub client's own failures: resolve() raises ConfigError only
        out.error(
            f"could not resolve hub id {given!r}: {exc.__class__.__name__}: {exc}",
            path="model",
            source=origin,
        )
        return None
    return ModelSource(
        given,
        origin,
        snapshot.path,
        snapshot.repo_id,
        snapshot.revision,
        snapshot.commit,
    )
