"""The contract every linear backend implements."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from diffserve.layers.backend import KernelBackend

# Activations a ``Linear`` may apply to its own output (``Linear(...,
# activation=name)``); a backend may fuse one into its GEMM, or apply it afterwards with
# ``activate``.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")
}


def activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    """``y`` through ``activation`` (``None``: unchanged), unfused."""
    return y if activation is None else ACTIVATIONS[activation](y)


class LinearBackend(KernelBackend):
    """A kernel for ``y = act(x @ weight.T + bias)``. Chosen once, at construction, by
    ``select_linear_backend``.

    ``Linear`` calls ``linear(x, weight, bias)`` for a plain layer and ``linear(x,
    weight, bias, activation)`` for one with an activation (a name in ``ACTIVATIONS``),
    so every call goes through this one method (a wrapper or a patched method sees all
    of them).
    """

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError
