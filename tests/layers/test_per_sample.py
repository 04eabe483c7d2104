"""Batch invariance by construction at the layer level (``layers/per_sample.py``): a
per-sample ``Linear`` or ``Attention`` gives every sample of a batch exactly what it
gives that sample alone, bit for bit, on every backend and dtype this machine runs, at
the GEMM shapes of real FLUX blocks (issue: on Intel AMX, oneDNN and MKL sum a [256,
3072] x [3072, 768] block in another order when three images share the call)."""

from __future__ import annotations

import pytest
import torch

from diffserve.errors import BackendUnavailableError
from diffserve.layers.attention.module import Attention
from diffserve.layers.attention.registry import select_attention_backend
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear.module import Linear
from diffserve.layers.linear.registry import select_linear_backend

# (tokens per image, in, out, activation): FLUX MLP down-projection (M=256, K=3072), the
# single block's linear2 (K = 768 + 3072), an MLP up-projection with its fused GELU, a
# QKV projection, a conditioning vector.
SHAPES = [
    (256, 3072, 768, None),
    (272, 3840, 768, None),
    (64, 768, 3072, "gelu_tanh"),
    (320, 768, 2304, None),
    (None, 256, 768, None),
]


def _runnable(kind: str, names: tuple[str, ...]) -> list[tuple[str, torch.dtype]]:
    select = select_linear_backend if kind == "linear" else select_attention_backend
    out = []
    for name in names:
        for dtype in (torch.float32, torch.bfloat16):
            try:
                select(name, "cpu", dtype)
            except BackendUnavailableError:
                continue
            out.append((name, dtype))
    return out


@pytest.mark.parametrize(
    ("backend", "dtype"), _runnable("linear", ("torch", "onednn")), ids=str
)
def test_per_sample_linear_rows_equal_each_sample_alone(
    backend: str, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    for tokens, k, n, activation in SHAPES:
        counters = KernelCounters()
        layer = Linear(
            k,
            n,
            backend=select_linear_backend(backend, "cpu", dtype),
            counters=counters,
            per_sample=True,
            activation=activation,
            dtype=dtype,
        ).requires_grad_(False)
        x = torch.randn(3, k) if tokens is None else torch.randn(3, tokens, k)
        x = x.to(dtype)
        with torch.inference_mode():
            batched = layer(x)
            # Still one counted call.
            assert counters.snapshot()["linear"] == {backend: 1}
            for i in range(3):
                assert torch.equal(batched[i : i + 1], layer(x[i : i + 1])), (
                    backend,
                    dtype,
                    tokens,
                    k,
                    n,
                    i,
                )


@pytest.mark.parametrize(
    ("backend", "dtype"), _runnable("attention", ("sdpa", "math")), ids=str
)
def test_per_sample_attention_equals_each_sample_alone(
    backend: str, dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    counters = KernelCounters()
    attention = Attention(
        "joint",
        backend=select_attention_backend(backend, "cpu", dtype),
        counters=counters,
        per_sample=True,
    )
    q, k, v = (torch.randn(3, 12, 320, 64).to(dtype) for _ in range(3))
    own = torch.rand(3, 1, 320, 320) > 0.2  # a padding mask per sample
    shared = torch.rand(1, 1, 320, 320) > 0.2  # one mask broadcast over the batch
    with torch.inference_mode():
        for mask in (None, own, shared):
            batched = attention(q, k, v, mask)
            for i in range(3):
                mine = own[i : i + 1] if mask is own else mask
                alone = attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], mine)
                assert torch.equal(batched[i : i + 1], alone), (backend, dtype, i)
    assert counters.snapshot()["attention"] == {backend: 3 * 4}


def test_without_per_sample_one_call_serves_the_whole_batch() -> None:
    seen: list[tuple[int, ...]] = []
    backend = select_linear_backend("torch", "cpu", torch.float32)
    original = backend.linear

    def recording(x, weight, bias, *rest):
        seen.append(tuple(x.shape))
        return original(x, weight, bias, *rest)

    backend.linear = recording  # type: ignore[method-assign]
    for per_sample, expected in ((False, [(3, 5, 8)]), (True, [(1, 5, 8)] * 3)):
        seen.clear()
        layer = Linear(
            8, 4, backend=backend, counters=KernelCounters(), per_sample=per_sample
        )
        layer(torch.randn(3, 5, 8))
        assert seen == expected
        assert ("per_sample" in repr(layer)) == per_sample
