"""Which platform overlay applies. Detection imports torch, so it runs only when no name was given."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

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


BF16_OVERRIDE_ENV = "DIFFSERVE_CPU_BF16"


@dataclass(frozen=True)
class CpuKind:
    """What kind of CPU this is for the numbers that matter here: its bfloat16 matmul units.

    ``name`` is one of ``CPU_KINDS``: ``AMX`` (Intel AMX tiles: bfloat16 GEMMs about 4-6x float32),
    ``AVX512_BF16`` (AVX512 bfloat16 dot products, e.g. AMD Zen 4: about 2x), ``AVX512`` (no bfloat16
    instructions), ``AVX2``, or ``other`` (another ISA, or flags unknown). ``flags`` are the /proc/cpuinfo
    flags that decided it. torch's own ``get_cpu_capability()`` says ``AVX512`` for the first three, so
    benchmark reports, the compile-cache key and ``config explain`` use this instead.
    """

    name: str
    flags: tuple[str, ...] = ()

    @property
    def native_bfloat16(self) -> bool:
        return self.name in ("AMX", "AVX512_BF16")

    def describe(self) -> str:
        return f"{self.name} ({', '.join(self.flags)})" if self.flags else self.name


# Most capable first: the first kind whose deciding flag the CPU has wins.
CPU_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AMX", ("amx_bf16", "amx_int8", "amx_tile")),
    ("AVX512_BF16", ("avx512_bf16",)),
    ("AVX512", ("avx512f",)),
    ("AVX2", ("avx2",)),
)


def _cpu_flags(cpuinfo: str) -> list[str]:
    return next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                 if line.startswith(("flags", "Features"))), [])


def cpu_kind(cpuinfo: str | None = None) -> CpuKind:
    """This CPU's kind from ``/proc/cpuinfo`` (or the given text); ``other`` where it cannot be read.
    No torch import: resolving a config stays cheap."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read()
        except OSError:
            return CpuKind("other")
    flags = set(_cpu_flags(cpuinfo))
    for name, deciding in CPU_KINDS:
        if deciding[0] in flags:
            return CpuKind(name, tuple(flag for flag in deciding if flag in flags))
    return CpuKind("other")


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
    kind = cpu_kind(cpuinfo)
    if kind.native_bfloat16:
        return True, f"the CPU is {kind.describe()}"
    return False, f"the CPU is {kind.describe()}: neither avx512_bf16 nor amx_bf16"
