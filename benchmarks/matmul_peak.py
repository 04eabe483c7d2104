"""This machine's measured matmul peak per dtype: the best median GFLOP/s over square
sizes and GEMM backends.

It is the ceiling a transformer step is judged against, so it must be the true one: a
"peak" that one of the model's own GEMMs beats makes every fraction meaningless. On the
Intel AMX machine of issue 26, ``torch.mm`` at 1024² reached 1466 GFLOP/s while the
packed oneDNN GEMM reached 2225 GFLOP/s at the model's shape and ``torch.mm`` about 2.7
TFLOP/s at 2048². So every backend a linear layer can run on (``torch.mm``, ``F.linear``
i.e. ``x @ w.T``, and the oneDNN inner product on a weight packed once, which is what
``linear_backend: onednn`` calls) is timed at every size from ``PROBE`` doubling up to
``size``, and the best median wins; the size and backend it came from are reported.

On CPUs without bf16 units (AVX2 only) torch's bfloat16 GEMMs are orders of magnitude
slower than float32, so sizes whose one product would take more than about
``MAX_CALL_S`` at the probed speed are skipped, and a backend whose first call is far
slower than the best so far is not repeated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import median

PROBE = 512
MAX_CALL_S = 3.0


def _backends(dtype: Any) -> dict[str, Callable[[Any, Any], Any]]:
    """name -> ``f(a, b)`` computing an n x n x n product, for every GEMM a linear layer
    may run on."""
    import torch

    out: dict[str, Callable[[Any, Any], Any]] = {
        "torch.mm": torch.mm,
        "F.linear": torch.nn.functional.linear,
    }
    try:
        from diffserve.layers.linear.onednn import OneDnnLinearBackend
    except ImportError:
        return out
    if OneDnnLinearBackend.unavailable_reason(torch.device("cpu"), dtype) is None:
        backend = OneDnnLinearBackend(torch.device("cpu"), dtype)
        out["oneDNN packed"] = lambda a, b: backend.linear(a, b, None)
    return out


def _seconds(
    op: Callable[[Any, Any], Any], n: int, dtype: Any, iters: int, give_up_s: float
) -> list[float]:
    """Seconds per call of ``op`` on n x n operands (empty when its first call exceeds
    ``give_up_s``)."""
    import torch

    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    with torch.inference_mode():
        t0 = time.perf_counter()
        op(a, b)  # warm-up: first-call allocation, kernel selection, weight packing
        if time.perf_counter() - t0 > give_up_s:
            return []
        out = []
        for _ in range(iters):
            t0 = time.perf_counter()
            op(a, b)
            out.append(time.perf_counter() - t0)
    return out


def peak_gflops(dtype_name: str, size: int, iters: int = 5) -> dict[str, Any]:
    """The best median GFLOP/s of n x n x n products (2 n³ FLOPs) over every backend and
    every n from ``PROBE`` (or ``size`` if smaller) doubling up to ``size``; ``{"size",
    "backend", "gflops", "median_s", "tried"}`` where ``tried`` lists every (size,
    backend, GFLOP/s) measured."""
    from benchmarks.contenders import torch_dtype

    dtype = torch_dtype(dtype_name)
    backends = _backends(dtype)
    n = min(PROBE, size)
    best: dict[str, Any] = {"gflops": 0.0}
    tried: list[tuple[int, str, float]] = []
    while n <= size:
        for name, op in backends.items():
            rate = best["gflops"] * 1e9
            # Skip a size whose one call would take too long at the best speed seen, and
            # a backend whose first call is far slower than that (torch.mm in bfloat16
            # without bf16 units).
            if rate and 2 * n**3 / rate > MAX_CALL_S:
                continue
            give_up = max(3 * 2 * n**3 / rate, 0.05) if rate else MAX_CALL_S * 10
            times = _seconds(op, n, dtype, iters if n > PROBE or rate else 3, give_up)
            if not times:
                continue
            seconds = median(times)
            gflops = 2 * n**3 / seconds / 1e9
            tried.append((n, name, round(gflops, 1)))
            if gflops > best["gflops"]:
                best = {
                    "size": n,
                    "backend": name,
                    "gflops": gflops,
                    "median_s": seconds,
                }
        n *= 2
    return {**best, "tried": tried}


def linear_gflops(
    dtype_name: str, tokens: int, d_in: int, d_out: int, iters: int = 10
) -> float:
    """GFLOP/s of F.linear at one of the model's own shapes: the ceiling its layer sizes
    allow, which for a small model sits below the large-square peak."""
    import torch

    from benchmarks.contenders import torch_dtype

    dtype = torch_dtype(dtype_name)
    x = torch.randn(tokens, d_in).to(dtype)
    w = torch.randn(d_out, d_in).to(dtype)
    torch.nn.functional.linear(x, w)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        times.append(time.perf_counter() - t0)
    return 2 * tokens * d_in * d_out / median(times) / 1e9
