"""Per-backend call counters: proof of which kernel ran every linear and attention call.

One ``KernelCounters`` is created per transformer and handed to each of its ``Linear``
and ``Attention`` modules at construction, so only calls inside the transformer are
counted (text encoders and the VAE are transformers/diffusers modules and never see it).
Counting is a dict increment per call, cheap enough to stay on in production.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from diffserve.layers.collectives import CollectiveCounters
from diffserve.types.attestation import KernelTally


class KernelCounters:
    """Counts calls per backend name for linear and attention, plus transformer
    forwards."""

    def __init__(self) -> None:
        self.linear: dict[str, int] = {}
        self.attention: dict[str, int] = {}
        self.transformer_forwards = 0
        self.lora_linear_calls = 0  # Linear calls that added a LoRA delta
        # Collectives of a parallel layout (layers/collectives.py); reported beside the
        # snapshot.
        self.collectives = CollectiveCounters()
        self._paused = 0

    @property
    def active(self) -> bool:
        return self._paused == 0

    def count_linear(self, backend_name: str, calls: int = 1) -> None:
        if self._paused == 0:
            self.linear[backend_name] = self.linear.get(backend_name, 0) + calls

    def count_attention(self, backend_name: str, calls: int = 1) -> None:
        if self._paused == 0:
            self.attention[backend_name] = self.attention.get(backend_name, 0) + calls

    def count_lora(self, calls: int = 1) -> None:
        if self._paused == 0:
            self.lora_linear_calls += calls

    def count_forward(self) -> None:
        if self._paused == 0:
            self.transformer_forwards += 1

    def add(self, tally: Mapping[str, Any]) -> None:
        """Add a ``snapshot()``-shaped tally (used for compiled blocks, whose modules
        cannot count)."""
        for name, calls in tally.get("linear", {}).items():
            self.count_linear(name, calls)
        for name, calls in tally.get("attention", {}).items():
            self.count_attention(name, calls)
        self.count_lora(tally.get("lora_linear_calls", 0))

    def snapshot(self) -> KernelTally:
        """``{"linear": {name: n}, "attention": {name: n}, "transformer_forwards": k}``
        (a copy)."""
        tally = KernelTally(
            linear=dict(self.linear),
            attention=dict(self.attention),
            transformer_forwards=self.transformer_forwards,
        )
        if self.lora_linear_calls:
            tally["lora_linear_calls"] = self.lora_linear_calls
        return tally

    def reset(self) -> None:
        self.linear.clear()
        self.attention.clear()
        self.transformer_forwards = 0
        self.lora_linear_calls = 0
        self.collectives.reset()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop counting inside the block (warmup runs); nests."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __repr__(self) -> str:
        return f"KernelCounters({self.snapshot()})"
