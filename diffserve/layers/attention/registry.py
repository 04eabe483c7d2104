"""Attention backends by name. Implementations are imported only when chosen."""

from __future__ import annotations

import importlib

import torch

from diffserve.errors import BackendUnavailableError
from diffserve.layers.attention.base import AttentionBackend
from diffserve.logging import get_logger

logger = get_logger(__name__)

# name -> "module:Class". "math" is a reference and never chosen by auto.
ATTENTION_BACKENDS: dict[str, str] = {
    "flash_attn": "diffserve.layers.attention.flash:FlashAttentionBackend",
    "sdpa": "diffserve.layers.attention.sdpa:SdpaAttentionBackend",
    "math": "diffserve.layers.attention.math:MathAttentionBackend",
}
AUTO_PREFERENCE = ("flash_attn", "sdpa")


def attention_backend_names() -> list[str]:
    return list(ATTENTION_BACKENDS)


def get_attention_backend_class(name: str) -> type[AttentionBackend]:
    target = ATTENTION_BACKENDS.get(name)
    if target is None:
        raise BackendUnavailableError(
            f"unknown attention backend {name!r}; valid: auto, {', '.join(ATTENTION_BACKENDS)}"
        )
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def select_attention_backend(name: str, device: torch.device | str, dtype: torch.dtype) -> AttentionBackend:
    """Return a backend instance for ``name`` on ``device``/``dtype``.

    ``auto`` prefers flash_attn (CUDA, half precision, package installed) and falls back to sdpa; an
    explicit name that cannot run here raises ``BackendUnavailableError`` saying what is missing.
    """
    device = torch.device(device)
    if name == "auto":
        for candidate in AUTO_PREFERENCE:
            cls = get_attention_backend_class(candidate)
            if cls.unavailable_reason(device, dtype) is None:
                logger.debug("attention backend auto -> %s on %s/%s", candidate, device, dtype)
                return cls(device, dtype)
        raise BackendUnavailableError(f"no attention backend can run on {device}/{dtype}")
    cls = get_attention_backend_class(name)
    reason = cls.unavailable_reason(device, dtype)
    if reason is not None:
        raise BackendUnavailableError(f"attention backend {name!r} was requested but cannot run here: {reason}")
    return cls(device, dtype)
