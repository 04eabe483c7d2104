"""How a setting is declared: ``opt`` (one leaf: its default, help text, ingress
normalizer and JSON type) and ``section`` (a nested section with its flag prefix).
``dataclasses.fields()`` of the schema classes carry this metadata to every consumer
(``fields.py``)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from diffserve.config import canonical as c


def opt(
    default: Any, doc: str, normalize: c.Normalizer, *, kind: str = "str", **extra: Any
) -> Any:
    """Declare one setting: its default, help text, ingress normalizer and JSON type."""
    meta = {"doc": doc, "normalize": normalize, "kind": kind, **extra}
    return field(default=default, metadata=meta)


def section(cls: type, doc: str, flat_prefix: str) -> Any:
    """Declare a nested section; ``flat_prefix`` + leaf name is its CLI flag / env
    variable name."""
    return field(
        default_factory=cls,
        metadata={"doc": doc, "section": cls, "flat_prefix": flat_prefix},
    )
