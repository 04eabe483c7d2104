"""Which platform overlay applies. Detection imports torch, so it runs only when no name was given."""

from __future__ import annotations

import importlib.util

from diffserve.config.canonical import normalize_platform
from diffserve.errors import ConfigError


def detect_platform() -> str:
    """cuda / rocm / xpu / mps when torch sees that device, else cpu."""
    if importlib.util.find_spec("torch") is None:
        return "cpu"
    import torch  # lazy on purpose: `import diffserve.config.resolve` must not pull in torch

    if torch.cuda.is_available():
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def current_platform(name: str | None) -> str:
    """The canonical platform name: the one given (validated) or the detected one."""
    if name is None:
        return detect_platform()
    try:
        return normalize_platform(name)
    except ConfigError as exc:
        raise ConfigError(exc.rule, path="platform", source="--platform / platform=", hint=exc.hint) from None
