"""Which platform overlay applies. Detection imports torch, so it runs only when no name
was given."""

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
    # lazy on purpose: `import diffserve.config.resolve` must not pull in torch
    import torch

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
        raise ConfigError(
            exc.rule, path="platform", source="--platform / platform=", hint=exc.hint
        ) from None


BF16_OVERRIDE_ENV = "DIFFSERVE_CPU_BF16"


@dataclass(frozen=True)
class CpuKind:
    """What kind of CPU this is for the numbers that matter here: its bfloat16 matmul
    units.

    ``name`` is one of ``CPU_KINDS``: ``AMX`` (Intel AMX tiles: bfloat16 GEMMs about
    4-6x float32), ``AVX512_BF16`` (AVX512 bfloat16 dot products, e.g. AMD Zen 4: about
    2x), ``AVX512`` (no bfloat16 instructions), ``AVX2``, or ``other`` (another ISA, or
    flags unknown). ``flags`` are the /proc/cpuinfo flags that decided it. torch's own
    ``get_cpu_capability()`` says ``AVX512`` for the first three, so benchmark reports,
    the compile-cache key and ``config explain`` use this instead.
    """

    name: str
    flags: tuple[str, ...] = ()
    # The machine's real kind when this one is emulated (``DIFFSERVE_CPU_KIND``), else
    # "".
    emulated_on: str = ""

    @property
    def native_bfloat16(self) -> bool:
        return self.name in ("AMX", "AVX512_BF16")

    @property
    def avx512(self) -> bool:
        """Whether the kernels may use AVX512 (oneDNN's bfloat16 GEMMs need it)."""
        return self.name in ("AMX", "AVX512_BF16", "AVX512")

    def describe(self) -> str:
        if self.emulated_on:
            return f"{self.name} (emulated on {self.emulated_on}: {EMULATED_KIND_ENV})"
        return f"{self.name} ({', '.join(self.flags)})" if self.flags else self.name


EMULATED_KIND_ENV = "DIFFSERVE_CPU_KIND"

# Most capable first: the first kind whose deciding flag the CPU has wins.
CPU_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("AMX", ("amx_bf16", "amx_int8", "amx_tile")),
    ("AVX512_BF16", ("avx512_bf16",)),
    ("AVX512", ("avx512f",)),
    ("AVX2", ("avx2",)),
)


# kind -> (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS): the
# instructions its kernels use.
_EMULATION: dict[str, tuple[str, str, str]] = {
    "AMX": ("avx512", "AVX512_CORE_AMX", "AVX512"),
    "AVX512_BF16": ("avx512", "AVX512_CORE_BF16", "AVX512"),
    "AVX512": ("avx512", "AVX512_CORE", "AVX512"),
    "AVX2": ("avx2", "AVX2", "AVX2"),
}


def _cpu_flags(cpuinfo: str) -> list[str]:
    return next(
        (
            line.split(":", 1)[1].split()
            for line in cpuinfo.splitlines()
            if line.startswith(("flags", "Features"))
        ),
        [],
    )


def cpu_kind(cpuinfo: str | None = None) -> CpuKind:
    """This CPU's kind from ``/proc/cpuinfo`` (or the given text); ``other`` where it
    cannot be read. ``DIFFSERVE_CPU_KIND`` names a kind to emulate instead
    (``emulation_env``). No torch import: resolving a config stays cheap."""
    detected = _detected_kind(cpuinfo)
    requested = os.environ.get(EMULATED_KIND_ENV, "").strip()
    return (
        detected
        if cpuinfo is not None or not requested
        else emulate(detected, requested)
    )


def emulate(detected: CpuKind, requested: str) -> CpuKind:
    """``requested`` emulated on a CPU of kind ``detected``: a kind at or below it (a
    kind needs its instructions; the same kind is the machine itself), else a
    ``ConfigError`` naming the variable."""
    names = [name for name, _ in CPU_KINDS]
    requested = requested.upper()
    if requested == detected.name:
        return detected
    if (
        requested not in names
        or detected.name not in names
        or names.index(requested) < names.index(detected.name)
    ):
        below = names[names.index(detected.name) :] if detected.name in names else []
        raise ConfigError(
            f"{EMULATED_KIND_ENV}={requested} cannot be emulated "
            f"on this {detected.name} CPU",
            path=EMULATED_KIND_ENV,
            source="environment",
            hint=f"name one of {', '.join(below) or 'no kind'} (a kind "
            "needs its instructions), "
            "or unset it",
        )
    return CpuKind(requested, emulated_on=detected.name)


def emulation_env(kind: str) -> dict[str, str]:
    """The environment that makes a process compute as a CPU of ``kind`` would, on a
    machine of that kind or a more capable one: ATen's kernels
    (``ATEN_CPU_CAPABILITY``), oneDNN's (``ONEDNN_MAX_CPU_ISA``: no AMX tiles, no AVX512
    bfloat16 dot products) and MKL's (``MKL_ENABLE_INSTRUCTIONS``) capped at the kind's
    instructions, and the kind detection told the same (``DIFFSERVE_CPU_KIND``), so
    platform defaults and backend choices follow the emulated kind. Read at process
    start: set it before torch is imported."""
    aten, onednn, mkl = _EMULATION[kind]
    return {
        "ATEN_CPU_CAPABILITY": aten,
        "ONEDNN_MAX_CPU_ISA": onednn,
        "MKL_ENABLE_INSTRUCTIONS": mkl,
        EMULATED_KIND_ENV: kind,
    }


def _detected_kind(cpuinfo: str | None) -> CpuKind:
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
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), and why we
    think so.

    ``DIFFSERVE_CPU_BF16=1|0`` overrides the detection (tests inject either kind with
    it; an operator can pin float32 on a machine whose bfloat16 numbers they do not
    want). Reads ``/proc/cpuinfo`` only: no torch import, so resolving stays cheap;
    elsewhere (no such file) the answer is no."""
    override = os.environ.get(BF16_OVERRIDE_ENV, "").strip().lower()
    if override in ("1", "true", "yes", "on"):
        return True, f"{BF16_OVERRIDE_ENV}={override}"
    if override in ("0", "false", "no", "off"):
        return False, f"{BF16_OVERRIDE_ENV}={override}"
    kind = cpu_kind(cpuinfo)
    if kind.native_bfloat16:
        return True, f"the CPU is {kind.describe()}"
    return False, f"the CPU is {kind.describe()}: neither avx512_bf16 nor amx_bf16"
