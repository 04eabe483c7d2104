"""The reference linear backend: ``torch.nn.functional.linear`` (any device, any
dtype)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffserve.layers.linear.base import LinearBackend, activate


class TorchLinearBackend(LinearBackend):
    name = "torch"

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
    ) -> torch.Tensor:
        return activate(F.linear(x, weight, bias), activation)
