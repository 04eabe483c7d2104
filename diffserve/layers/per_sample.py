"""Batch invariance by construction: each sample of a batch goes through its own kernel
call.

A GEMM kernel is chosen by its shape, and kernels for different shapes sum in different
orders: on an Intel AMX CPU, oneDNN (and MKL in float32) multiplies a ``[256, 3072] x
[3072, 768]`` block differently when it is one image's rows than when it is three
images' rows, so an image would change in its last bits with the batch it runs in. Where
a kernel set is ``batch_invariant`` (the stage's ``batch_invariant``, default true),
``Linear`` and ``Attention`` split their input along dim 0 and call the backend once per
sample: every call then has exactly the shape of the request run alone, whatever the
batch, on every CPU kind and dtype, without relying on a kernel heuristic. It is still
one counted call per module.

Elementwise ops stay whole-batch: they never mix rows, and a row comes out as it does
alone as long as its element count is a multiple of two vector widths (ATen finishes a
tensor's tail with scalar code, which rounds ``exp`` differently): 64 values covers
every CPU kind and dtype, and every real model width is one (docs/engine.md).

On CPU a batch of ``b`` already costs about ``b`` x one image, so the split costs little
there (measured in docs/engine.md, "Batch invariance"); on accelerators, where batching
makes an image cheaper, a deployment may set ``batch_invariant: false`` and accept
last-bit differences.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def each_sample(
    run: Callable[..., Tensor], *batched: Tensor, mask: Tensor | None = None
) -> Tensor:
    """``run(*batched)`` (and ``mask=`` when one is given) one sample at a time along
    dim 0, the results concatenated. ``mask`` is cut per sample when it has a batch
    dimension of its own (same rank as the inputs, dim 0 = the batch), else every call
    gets it whole (a mask broadcast over the batch)."""
    batch = batched[0].shape[0]
    own_mask = (
        mask is not None and mask.ndim == batched[0].ndim and mask.shape[0] == batch
    )
    outputs = []
    for i in range(batch):
        args = [t[i : i + 1] for t in batched]
        if mask is None:
            outputs.append(run(*args))
        else:
            outputs.append(run(*args, mask[i : i + 1] if own_mask else mask))
    return torch.cat(outputs)
