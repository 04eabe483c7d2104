"""Linear backends by name. Implementations are imported only when chosen."""

from __future__ import annotations

import torch

from diffserve.layers.backend import BackendRegistry
from diffserve.layers.linear.base import LinearBackend

# name -> "module:Class"; the order is auto's preference (first available wins).
LINEAR_BACKENDS: dict[str, str] = {
    "torch": "diffserve.layers.linear.torch:TorchLinearBackend",
}
REGISTRY: BackendRegistry[LinearBackend] = BackendRegistry("linear", LINEAR_BACKENDS, tuple(LINEAR_BACKENDS))


def linear_backend_names() -> list[str]:
    return REGISTRY.names()


def get_linear_backend_class(name: str) -> type[LinearBackend]:
    return REGISTRY.get_class(name)


def select_linear_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> LinearBackend:
    """Return a backend instance for ``name`` on ``device``/``dtype`` (module-level so tests can wrap it)."""
    return REGISTRY.select(name, device, dtype)
