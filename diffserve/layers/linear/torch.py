"""The reference linear backend: ``torch.nn.functional.linear`` (any device, any
dtype). A tanh-GELU over a layer's tail columns is ``diffserve::gemm_gelu_tail``
(``layers/ops.py``): one GEMM and one graph node, the GELU written in place after it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Registers diffserve::gemm_gelu_tail (loaded once the backend is chosen)
from diffserve.layers import ops  # noqa: F401
from diffserve.layers.linear.base import LinearBackend, activate


class TorchLinearBackend(LinearBackend):
    name = "torch"

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
        activation_from: int = 0,
    ) -> torch.Tensor:
        if activation == "gelu_tanh" and activation_from > 0:
            return torch.ops.diffserve.gemm_gelu_tail(x, weight, bias, activation_from)
        return activate(F.linear(x, weight, bias), activation, activation_from)
