"""Helpers for config tests: write YAML files and resolve with no ambient
environment."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from diffserve.config.resolve import resolve


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def line_of(path: Path, needle: str) -> int:
    """1-based line of the first line containing ``needle`` (tests assert file:line
    provenance)."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def run(**kwargs: Any):
    """resolve() pinned to the cpu platform and an empty environment unless the test
    says otherwise."""
    kwargs.setdefault("platform", "cpu")
    kwargs.setdefault("env", {})
    return resolve(**kwargs)
