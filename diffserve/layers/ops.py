"""diffserve's own ``torch.library`` operators: one graph node each under
``torch.compile`` (a fake implementation gives the output's shape, so tracing never
breaks the graph) and a name the traced-graph tally (``layers/traced_tally.py``) counts.

- ``diffserve::gemm_gelu_tail(x, weight, bias, start)``: ``x @ weight.T + bias`` with
  the tanh-GELU applied to output columns ``start:`` only: FLUX's single block runs its
  attention's Q/K/V and its MLP's input as one GEMM (``models/flux/blocks.py``), the
  GELU written in place over the MLP's columns right after it (no second GEMM, no copy).
- ``diffserve::fa3_attention(q, k, v)``: FlashAttention-3's forward (Hopper) on
  ``[B, L, H, D]`` tensors, from the ``fa3-fwd`` wheel (``fa3_fwd_interface``) or
  FlashAttention's own Hopper build (``flash_attn_interface``); CUDA only.

Importing this module registers the operators (once per process); the backends that
use them import it when they are chosen.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# The Python modules that provide FlashAttention-3's ``flash_attn_func``, in order of
# preference: the forward-only ``fa3-fwd`` wheel, then FlashAttention's Hopper build.
FA3_MODULES = ("fa3_fwd_interface", "flash_attn_interface")


@torch.library.custom_op("diffserve::gemm_gelu_tail", mutates_args=())
def gemm_gelu_tail(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, start: int
) -> torch.Tensor:
    y = F.linear(x, weight, bias)
    tail = y.narrow(-1, start, y.shape[-1] - start)
    # The GEMM's output is fresh: its tail is overwritten in place (one elementwise
    # pass over the MLP's columns, nothing copied or concatenated).
    tail.copy_(F.gelu(tail, approximate="tanh"))
    return y


@gemm_gelu_tail.register_fake
def _gemm_gelu_tail_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, start: int
) -> torch.Tensor:
    torch._check(0 <= start <= weight.shape[0])
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def fa3_function() -> Callable[..., Any] | None:
    """FlashAttention-3's ``flash_attn_func`` (``None``: no FA3 build is installed)."""
    for name in FA3_MODULES:
        if importlib.util.find_spec(name) is not None:
            return getattr(importlib.import_module(name), "flash_attn_func")  # noqa: B009
    return None


@torch.library.custom_op(
    "diffserve::fa3_attention", mutates_args=(), device_types="cuda"
)
def fa3_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    function = fa3_function()
    if function is None:
        raise RuntimeError(
            "diffserve::fa3_attention needs FlashAttention-3: pip install fa3-fwd"
        )
    out = function(q, k, v)
    # Some builds return (out, softmax_lse)
    return out[0] if isinstance(out, tuple) else out


@fa3_attention.register_fake
def _fa3_attention_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    torch._check(q.shape[-1] == k.shape[-1] and k.shape == v.shape)
    return q.new_empty((*q.shape[:-1], v.shape[-1]))
