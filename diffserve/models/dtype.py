"""The torch dtype a stage's ``dtype`` setting means on a device (shared by every
pipeline family)."""

from __future__ import annotations

import torch

from diffserve.config.platform import native_bfloat16

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """An explicit ``"auto"``: the platform-default rule
    (``config/platform_defaults.py``) at run time, bfloat16 on accelerators and on CPUs
    with native bfloat16 matmuls, float32 on other CPUs."""
    if name == "auto":
        return (
            torch.bfloat16
            if device.type != "cpu" or native_bfloat16()[0]
            else torch.float32
        )
    return DTYPES[name]
