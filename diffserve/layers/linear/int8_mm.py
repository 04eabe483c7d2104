"""W8A8 int8 GEMMs on a torchao ``Int8Tensor`` weight without torchao's eager dispatch.

torchao's int8 linear ends in ``safe_int_mm``, which decides whether it is being traced
by calling ``repr()`` on its input (``"FakeTensor" in input.__repr__()``): on a GPU
every eager int8 GEMM then formats a tensor, a device sync each, ~9.6k per FLUX.1-dev
image (34 s an image on an H200, 7x bfloat16). ``int8_dynamic_linear`` computes the
same method from the weight's int8 rows and scales directly: the activation quantized
per token (symmetric, as torchao's ``Int8DynamicActivationInt8WeightConfig``), one
``torch._int_mm``, both scales and the bias applied to its int32 result. It never asks
what a tensor is, so it runs the same eager and traced. On a GPU the weight's int8
rows are stored column-major once at quantization (``quantized.column_major_int8``), so
the GEMM's ``[K, N]`` operand is contiguous without a copy per call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# cuBLAS's int8 GEMM wants more than 16 rows: fewer (a modulation's one row per image)
# are padded to this many.
MIN_CUDA_ROWS = 32


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[M, K]`` -> (int8 ``[M, K]``, float32 scales ``[M, 1]``), symmetric."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-8) / 127.0
    q = torch.round(x.float() / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale


def int8_dynamic_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ W.T + bias`` for an ``Int8Tensor`` ``weight`` (``qdata`` int8 ``[N, K]``,
    ``scale`` per output row), with ``x`` quantized per token."""
    rows = x.reshape(-1, x.shape[-1])
    q, x_scale = quantize_per_token(rows)
    m = q.shape[0]
    if q.device.type == "cuda" and m < MIN_CUDA_ROWS:
        q = F.pad(q, (0, 0, 0, MIN_CUDA_ROWS - m))
    # torchao's Int8Tensor: int8 rows ``qdata`` [N, K] and a scale per row
    qdata, w_scale = getattr(weight, "qdata"), getattr(weight, "scale")  # noqa: B009
    acc = torch._int_mm(q, qdata.t())[:m]
    y = acc.float().mul_(x_scale).mul_(w_scale.reshape(1, -1).float())
    y = y.to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], y.shape[-1])
