"""Which platform overlay applies. Detection imports torch, so it runs only when no name was given."""

from __future__ import annotations

import importlib.util
import os

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


# CPU flags of native bfloat16 matrix instructions (Linux /proc/cpuinfo names).
BF16_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16")
BF16_OVERRIDE_ENV = "DIFFSERVE_CPU_BF16"


def native_bfloat16(cpuinfo: str | None = None) -> tuple[bool, str]:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), and why we think so.

    ``DIFFSERVE_CPU_BF16=1|0`` overrides the detection (tests inject either kind with it; an operator can
    pin float32 on a machine whose bfloat16 numbers they do not want). Reads ``/proc/cpuinfo`` only: no
    torch import, so resolving stays cheap; elsewhere (no such file) the answer is no."""
    override = os.environ.get(BF16_OVERRIDE_ENV, "").strip().lower()
    if override in ("1", "true", "yes", "on"):
        return True, f"{BF16_OVERRIDE_ENV}={override}"
    if override in ("0", "false", "no", "off"):
        return False, f"{BF16_OVERRIDE_ENV}={override}"
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read()
        except OSError:
            return False, "CPU flags unknown (no /proc/cpuinfo)"
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith(("flags", "Features"))), [])
    found = [flag for flag in BF16_FLAGS if flag in flags]
    if found:
        return True, f"the CPU has {'/'.join(found)}"
    return False, "the CPU has neither avx512_bf16 nor amx_bf16"
