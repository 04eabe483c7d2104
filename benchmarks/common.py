"""Shared measurement helpers: interleaved timing, medians, thread pinning, PSNR,
machine facts.

Every contender is timed with ``time.perf_counter`` and summarised by the median over
repeated runs after warm-up. Contenders are interleaved (A B, then B A, ...) so slow
drift of a shared machine (thermal, other tenants) lands on all of them alike instead of
on whichever ran last.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def cores() -> int:
    """Cores this process may run on (affinity-aware); every contender gets this many
    threads."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def pin_threads() -> int:
    """Give torch (intra-op) the same thread count for every contender in this
    process."""
    import torch

    n = cores()
    torch.set_num_threads(n)
    return n


def subprocess_env() -> dict[str, str]:
    """Environment for child processes: offline, and the same thread count as in-process
    contenders."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS=str(cores()),
    )
    return env


def time_call(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds one call took, and its result."""
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def interleaved(
    contenders: dict[str, Callable[[], Any]],
    *,
    warmup: int,
    iters: int,
    budget_s: float | None = None,
    min_iters: int = 3,
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Time each contender after ``warmup`` untimed calls, alternating the order every
    round (ABC, CBA, ...). With ``budget_s``, the first timed round sets how many rounds
    fit in the budget (between ``min_iters`` and ``iters``), so slow cases (bfloat16 on
    CPUs without bf16 units) cannot blow the run's time limit. Returns the seconds of
    every timed call and each one's last result."""
    names = list(contenders)
    last: dict[str, Any] = {}
    for _ in range(warmup):
        for name in names:
            last[name] = contenders[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    rounds = iters
    i = 0
    while i < rounds:
        order = names if i % 2 == 0 else names[::-1]
        for name in order:
            seconds, last[name] = time_call(contenders[name])
            samples[name].append(seconds)
        if i == 0 and budget_s is not None:
            per_round = sum(samples[name][0] for name in names)
            rounds = max(
                min(min_iters, iters), min(iters, int(budget_s // max(per_round, 1e-9)))
            )
        i += 1
    return samples, last


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def spread(values: Sequence[float]) -> float:
    """Relative half-range (max - min) / (2 * median): a rough noise figure printed next
    to medians."""
    if len(values) < 2:
        return 0.0
    m = median(values)
    return (max(values) - min(values)) / (2 * m) if m else float("nan")


def to_array(image: Any) -> np.ndarray:
    """A PIL image, uint8 numpy array or uint8 tensor [H, W, 3] (or [1, H, W, 3]) as
    float32."""
    if hasattr(image, "detach"):
        image = image.detach().cpu().float().numpy()
    arr = np.asarray(image, dtype=np.float32)
    return arr[0] if arr.ndim == 4 else arr


def psnr(a: Any, b: Any) -> float:
    """PSNR in dB between two 8-bit images (computed in float32); inf when identical."""
    x, y = to_array(a), to_array(b)
    if x.shape != y.shape:
        raise ValueError(f"image shapes differ: {x.shape} vs {y.shape}")
    mse = float(np.mean((x - y) ** 2))
    return float("inf") if mse == 0 else 10.0 * float(np.log10(255.0**2 / mse))


def machine() -> dict[str, Any]:
    """CPU model, cores, memory and the library versions every number depends on."""
    import diffusers
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        mem_gib = round(
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1
        )
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    from diffserve.config.platform import cpu_kind

    try:
        import diffserve

        diffserve_version = diffserve.__version__
    except Exception:  # noqa: BLE001 - a broken tree still gets a machine section
        diffserve_version = "unavailable"
    return {
        "cpu": cpu,
        "cores": cores(),
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "diffserve": diffserve_version,
        # The CPU kind (diffserve.config.platform.cpu_kind: AMX, AVX512_BF16, AVX512,
        # AVX2, other): each kind keeps its own report; torch's capability says AVX512
        # for the first three. An emulated kind (DIFFSERVE_CPU_KIND) is not that kind's
        # timing: it gets a report of its own, e.g. AVX2-ON-AMX.
        "cpu_capability": kind_name(cpu_kind()),
        "cpu_kind_flags": ", ".join(cpu_kind().flags),
        "torch_cpu_capability": _cpu_capability(torch),
        "loadavg_at_start": [round(x, 2) for x in load] if load else None,
    }


def kind_name(kind: Any) -> str:
    return f"{kind.name}-ON-{kind.emulated_on}" if kind.emulated_on else str(kind.name)


def _cpu_capability(torch: Any) -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001
        return "unknown"


def _luma(image: Any) -> np.ndarray:
    """ITU-R BT.601 luminance (0..255, float64) of an RGB image; a single-channel image
    as is."""
    arr = to_array(image).astype(np.float64)
    if arr.ndim == 3 and arr.shape[-1] >= 3:
        return arr[..., 0] * 0.299 + arr[..., 1] * 0.587 + arr[..., 2] * 0.114
    return arr[..., 0] if arr.ndim == 3 else arr


def _gaussian_filter(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering of a 2-D array with a 1-D kernel along both axes."""
    rows = np.apply_along_axis(lambda r: np.convolve(r, kernel, mode="valid"), 1, x)
    return np.apply_along_axis(lambda c: np.convolve(c, kernel, mode="valid"), 0, rows)


def ssim(a: Any, b: Any, *, window: int = 11, sigma: float = 1.5) -> float:
    """Mean SSIM (Wang et al. 2004) between two 8-bit images on their luminance: 11x11
    Gaussian window (sigma 1.5), K1 = 0.01, K2 = 0.03, L = 255, 'valid' windows only.
    1.0 when identical."""
    x, y = _luma(a), _luma(b)
    if x.shape != y.shape:
        raise ValueError(f"image shapes differ: {x.shape} vs {y.shape}")
    side = min(x.shape)
    if side < window:  # tiny images: the largest odd window that fits
        window = side if side % 2 else side - 1
    half = window // 2
    kernel = np.exp(-0.5 * (np.arange(-half, half + 1) / sigma) ** 2)
    kernel /= kernel.sum()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mu_x, mu_y = _gaussian_filter(x, kernel), _gaussian_filter(y, kernel)
    var_x = _gaussian_filter(x * x, kernel) - mu_x**2
    var_y = _gaussian_filter(y * y, kernel) - mu_y**2
    cov = _gaussian_filter(x * y, kernel) - mu_x * mu_y
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / (
        (mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2)
    )
    return float(ssim_map.mean())
