"""The contract every linear backend implements."""

from __future__ import annotations

import torch

from diffserve.layers.backend import KernelBackend


class LinearBackend(KernelBackend):
    """A kernel for ``y = x @ weight.T + bias``. Chosen once, at construction, by ``select_linear_backend``."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError
