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


def activate(
    y: torch.Tensor, activation: str | None, activation_from: int = 0
) -> torch.Tensor:
    """``y`` through ``activation`` (``None``: unchanged), unfused; with
    ``activation_from`` only output columns ``activation_from:`` (a merged projection
    whose head stays linear), overwritten in place in ``y``, a fresh GEMM output."""
    if activation is None:
        return y
    if activation_from == 0:
        return ACTIVATIONS[activation](y)
    tail = y.narrow(-1, activation_from, y.shape[-1] - activation_from)
    tail.copy_(ACTIVATIONS[activation](tail))
    return y


class LinearBackend(KernelBackend):
    """A kernel for ``y = act(x @ weight.T + bias)``. Chosen once, at construction, by
    ``select_linear_backend``.

    ``Linear`` calls ``linear(x, weight, bias)`` for a plain layer and ``linear(x,
    weight, bias, activation)`` for one with an activation (a name in ``ACTIVATIONS``),
    so every call goes through this one method (a wrapper or a patched method sees all
    of them). A layer whose activation covers only its output columns
    ``activation_from:`` (FLUX's merged single-block projection) also passes
    ``activation_from``.
    """

    def linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        activation: str | None = None,
        activation_from: int = 0,
    ) -> torch.Tensor:
        raise NotImplementedError
