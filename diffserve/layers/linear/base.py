"""The contract every linear backend implements."""

from __future__ import annotations

from typing import ClassVar

import torch


class LinearBackend:
    """A kernel for ``y = x @ weight.T + bias``. Chosen once, at construction, by ``select_linear_backend``.

    Subclasses set ``name`` and implement ``linear``; ``unavailable_reason`` says what is missing on this
    device/dtype (``None`` means it can run), so an explicit request fails at load with that text.
    """

    name: ClassVar[str] = ""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype

    @classmethod
    def unavailable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        return None

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
