"""Linear backends by name (the table is ``registry.backends.LINEAR_BACKENDS``)."""

from __future__ import annotations

import torch

from diffserve.layers.backend import BackendRegistry
from diffserve.layers.linear.base import LinearBackend
from diffserve.registry.backends import LINEAR_BACKENDS

REGISTRY: BackendRegistry[LinearBackend] = BackendRegistry(LINEAR_BACKENDS)


def select_linear_backend(
    name: str, device: torch.device | str, dtype: torch.dtype
) -> LinearBackend:
    """A backend instance for ``name`` on ``device``/``dtype`` (``auto``: the first that
    can run)."""
    return REGISTRY.select(name, device, dtype)
