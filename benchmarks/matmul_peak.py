"""This machine's measured matmul peak per dtype: median GFLOP/s of ``torch.mm`` (or ``F.linear``,
whichever is faster) on large squares.

It is the ceiling a transformer step is judged against: the best of the sizes tried (the requested
size and half of it). On CPUs without bf16 units (AVX2 only), torch's bfloat16 GEMM is orders of
magnitude slower than float32, so the size is lowered until one product takes seconds instead of
minutes; the size used is reported.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import median

PROBE = 512
MAX_CALL_S = 3.0


def _mm_seconds(n: int, dtype: Any, iters: int) -> list[float]:
    """Seconds per n x n x n product with the faster of torch.mm and F.linear (x @ w.T): for bfloat16
    on CPUs without bf16 units, torch.mm takes a slow generic path while F.linear goes to oneDNN, and a
    peak that a model's linears beat would make the fraction meaningless."""
    import torch

    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    best: list[float] = []
    for op in (torch.nn.functional.linear, torch.mm):
        t0 = time.perf_counter()
        op(a, b)  # warm-up: first-call allocation and kernel selection
        first = time.perf_counter() - t0
        if best and first > 3 * median(best):
            continue  # far slower path (torch.mm in bf16 without bf16 units): skip its repeats
        out = []
        for _ in range(iters):
            t0 = time.perf_counter()
            op(a, b)
            out.append(time.perf_counter() - t0)
        if not best or median(out) < median(best):
            best = out
    return best


def peak_gflops(dtype_name: str, size: int, iters: int = 5) -> dict[str, float]:
    """The best median GFLOP/s of n x n x n products (2*n^3 FLOPs) for n in {size/2, size}, skipping
    sizes whose one call would take more than about MAX_CALL_S at the probed speed (then halving)."""
    from benchmarks.contenders import torch_dtype

    dtype = torch_dtype(dtype_name)
    probe_n = min(PROBE, size)
    probe = median(_mm_seconds(probe_n, dtype, 3))
    rate = 2 * probe_n**3 / max(probe, 1e-9)
    n = size
    while n > probe_n and 2 * n**3 / rate > MAX_CALL_S:
        n //= 2
    results = [{"size": probe_n, "gflops": rate / 1e9, "median_s": probe}]
    for m in sorted({max(n // 2, probe_n), n} - {probe_n}):
        seconds = median(_mm_seconds(m, dtype, iters))
        results.append({"size": m, "gflops": 2 * m**3 / seconds / 1e9, "median_s": seconds})
    return max(results, key=lambda r: r["gflops"])


def linear_gflops(dtype_name: str, tokens: int, d_in: int, d_out: int, iters: int = 10) -> float:
    """GFLOP/s of F.linear at one of the model's own shapes: the ceiling its layer sizes allow, which
    for a small model sits below the large-square peak."""
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
