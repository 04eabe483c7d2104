"""Linear layers and their backend registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffserve.layers.linear import registry

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from diffserve.layers.linear.base import LinearBackend

__all__ = ["select_linear_backend"]


def select_linear_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> LinearBackend:
    """Same as ``registry.select_linear_backend``, looked up at call time so patching either name works."""
    return registry.select_linear_backend(name, device, dtype)
