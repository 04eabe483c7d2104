"""docs/config.md documents every key, flag and environment variable the schema
defines."""

from __future__ import annotations

from pathlib import Path

from diffserve.config.canonical import (
    ATTENTION_BACKEND_ALIASES,
    DTYPE_ALIASES,
    EXECUTOR_ALIASES,
    LINEAR_BACKEND_ALIASES,
)
from diffserve.config.fields import FLAT_LEAVES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text(
    encoding="utf-8"
)


def test_every_key_flag_and_env_var_is_documented() -> None:
    missing = [
        name
        for leaf in FLAT_LEAVES.values()
        for name in (
            f"`{leaf.key}`",
            f"`--{leaf.flat.replace('_', '-')}`",
            f"`DIFFSERVE_{leaf.flat.upper()}`",
        )
        if name not in DOC
    ]
    assert not missing, f"add to docs/config.md: {missing}"


def test_every_alias_is_documented() -> None:
    tables = (
        DTYPE_ALIASES,
        LINEAR_BACKEND_ALIASES,
        ATTENTION_BACKEND_ALIASES,
        EXECUTOR_ALIASES,
    )
    missing = [alias for table in tables for alias in table if f"`{alias}`" not in DOC]
    assert not missing, f"add to the alias table in docs/config.md: {missing}"
