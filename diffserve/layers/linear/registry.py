"""Linear backends by name. Implementations are imported only when chosen."""

from __future__ import annotations

import importlib

import torch

from diffserve.errors import BackendUnavailableError
from diffserve.layers.linear.base import LinearBackend
from diffserve.logging import get_logger

logger = get_logger(__name__)

# name -> "module:Class"; the order is auto's preference (first available wins).
LINEAR_BACKENDS: dict[str, str] = {
    "torch": "diffserve.layers.linear.torch:TorchLinearBackend",
}


def linear_backend_names() -> list[str]:
    return list(LINEAR_BACKENDS)


def get_linear_backend_class(name: str) -> type[LinearBackend]:
    target = LINEAR_BACKENDS.get(name)
    if target is None:
        raise BackendUnavailableError(
            f"unknown linear backend {name!r}; valid: auto, {', '.join(LINEAR_BACKENDS)}"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailableError(f"linear backend {name!r} cannot be imported: {exc}") from exc
    return getattr(module, class_name)


def select_linear_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> LinearBackend:
    """Return a backend instance for ``name`` on ``device``/``dtype``.

    ``auto`` takes the first available backend in preference order; an explicit name that cannot
    run here raises ``BackendUnavailableError`` saying what is missing (never a silent fallback).
    """
    device = torch.device(device)
    if name == "auto":
        reasons = []
        for candidate in LINEAR_BACKENDS:
            try:
                cls = get_linear_backend_class(candidate)
            except BackendUnavailableError as exc:
                reasons.append(str(exc))
                continue
            reason = cls.unavailable_reason(device, dtype)
            if reason is None:
                logger.debug("linear backend auto -> %s on %s/%s", candidate, device, dtype)
                return cls(device, dtype)
            reasons.append(f"{candidate}: {reason}")
        raise BackendUnavailableError(f"no linear backend can run on {device}/{dtype}: {'; '.join(reasons)}")
    cls = get_linear_backend_class(name)
    reason = cls.unavailable_reason(device, dtype)
    if reason is not None:
        raise BackendUnavailableError(f"linear backend {name!r} was requested but cannot run here: {reason}")
    return cls(device, dtype)
