"""Lazy ``"package.module:attr"`` targets: what every registry entry points at."""

from __future__ import annotations

import importlib
from typing import Any


def load_target(target: str) -> Any:
    """Import ``package.module`` and return its ``attr`` (ImportError/AttributeError
    propagate)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"registry target {target!r} is not 'package.module:attr'")
    return getattr(importlib.import_module(module_name), attr)


def spelling_table(
    names: tuple[str, ...] | list[str],
    aliases: dict[str, str],
    *,
    extra: tuple[str, ...] = (),
) -> dict[str, str]:
    """Accepted spelling -> canonical name: ``extra`` words (``auto``), each name
    itself, then aliases."""
    table = {word: word for word in extra}
    table.update({name: name for name in names})
    for alias, name in aliases.items():
        if name not in table:
            raise ValueError(f"alias {alias!r} points at unknown name {name!r}")
        table[alias] = name
    return table
