"""Deploy configuration: one resolver from deploy YAML, platform overlays, env and CLI to a typed,
frozen config with provenance. ``resolve``, ``ResolvedConfig`` and ``StageConfig`` load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ResolvedConfig", "StageConfig", "resolve"]

_LAZY = {
    "resolve": "diffserve.config.resolve",
    "ResolvedConfig": "diffserve.config.resolved",
    "StageConfig": "diffserve.config.schema",
}

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import resolve
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.config.schema import StageConfig


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'diffserve.config' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
