"""What linear and attention backends share: the base class and the selection of one by
name.

Names and ``"module:Class"`` targets come from ``diffserve.registry.backends`` (the one
table per kind, which config validates against), so nothing heavy (or CUDA-only) is
imported until a backend is chosen. ``auto`` walks a preference order and takes the
first backend that can run; an explicit name that cannot run here raises
``BackendUnavailableError`` saying what is missing (no silent fallback). ``auto`` also
passes over a backend that can run but was measured slower here (``auto_skip_reason``).
"""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

import torch

from diffserve.errors import BackendUnavailableError
from diffserve.logging import get_logger
from diffserve.registry.backends import BackendTable
from diffserve.registry.targets import load_target

logger = get_logger(__name__)


class KernelBackend:
    """A kernel implementation chosen once, at construction. Subclasses set ``name``;
    ``unavailable_reason`` says what is missing on this device/dtype (``None``: it can
    run)."""

    name: ClassVar[str] = ""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype

    @classmethod
    def unavailable_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        return None

    @classmethod
    def auto_skip_reason(cls, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why ``auto`` passes this runnable backend over here (measured slower than the
        next one on this device, dtype or CPU kind); ``None``: ``auto`` may take it. An
        explicit name still gets it."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


B = TypeVar("B", bound=KernelBackend)


class BackendRegistry(Generic[B]):
    """Backends of one kind (``linear``, ``attention``) from their registry table,
    imported lazily."""

    def __init__(self, table: BackendTable) -> None:
        self.table = table
        self.kind = table.kind
        self.targets = dict(table.targets)
        self.auto_preference = tuple(table.auto_preference)

    def names(self) -> list[str]:
        return list(self.targets)

    def get_class(self, name: str) -> type[B]:
        target = self.targets.get(name)
        if target is None:
            raise BackendUnavailableError(
                f"unknown {self.kind} backend {name!r}; valid: auto, "
                f"{', '.join(self.targets)}"
            )
        try:
            return load_target(target)
        except ImportError as exc:
            raise BackendUnavailableError(
                f"{self.kind} backend {name!r} cannot be imported: {exc}"
            ) from exc

    def select(self, name: str, device: torch.device | str, dtype: torch.dtype) -> B:
        """Return a backend instance for ``name`` (or the first runnable one for
        ``auto``)."""
        device = torch.device(device)
        if name == "auto":
            reasons = []
            for candidate in self.auto_preference:
                try:
                    cls = self.get_class(candidate)
                except BackendUnavailableError as exc:
                    reasons.append(str(exc))
                    continue
                reason = cls.unavailable_reason(device, dtype) or cls.auto_skip_reason(
                    device, dtype
                )
                if reason is None:
                    logger.debug(
                        "%s backend auto -> %s on %s/%s",
                        self.kind,
                        candidate,
                        device,
                        dtype,
                    )
                    return cls(device, dtype)
                reasons.append(f"{candidate}: {reason}")
            raise BackendUnavailableError(
                f"no {self.kind} backend can run on {device}/{dtype}: "
                f"{'; '.join(reasons)}"
            )
        cls = self.get_class(name)
        reason = cls.unavailable_reason(device, dtype)
        if reason is not None:
            raise BackendUnavailableError(
                f"{self.kind} backend {name!r} was requested but cannot "
                f"run here: {reason}"
            )
        return cls(device, dtype)
