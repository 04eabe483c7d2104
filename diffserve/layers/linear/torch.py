"""The reference linear backend: ``torch.nn.functional.linear`` (any device, any dtype)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffserve.layers.linear.base import LinearBackend


class TorchLinearBackend(LinearBackend):
    name = "torch"

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)
