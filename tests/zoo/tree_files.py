"""A built model directory's files, for the builders' byte-identical rebuild checks."""

from __future__ import annotations

from pathlib import Path


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative path, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
