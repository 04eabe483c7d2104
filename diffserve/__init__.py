"""diffserve: a serving engine for diffusion-transformer image models.

Import is cheap: the public names load their modules (and torch) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AsyncEngine",
    "Engine",
    "GenerationRequest",
    "RequestOutput",
    "resolve",
    "__version__",
]

_LAZY = {
    "Engine": "diffserve.engine.engine",
    "AsyncEngine": "diffserve.engine.async_engine",
    "GenerationRequest": "diffserve.types.request",
    "RequestOutput": "diffserve.types.request",
    "resolve": "diffserve.config.resolve",
}

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import resolve
    from diffserve.engine.async_engine import AsyncEngine
    from diffserve.engine.engine import Engine
    from diffserve.types.request import GenerationRequest, RequestOutput


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'diffserve' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
