"""Resolve a stage's kernel choice (linear backend, per-role attention backends) into
backend objects.

A model asks this once at construction for a ``KernelSet`` and builds every
``Linear``/``Attention`` from it, so the choice is made exactly once and recorded on
each module. The choice arrives in one shape: the stage's ``linear_backend`` name and
its ``AttentionBackendConfig``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from diffserve.config.stage_sections import AttentionBackendConfig
from diffserve.errors import ConfigError
from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.attention.module import Attention
from diffserve.layers.attention.registry import select_attention_backend
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear.base import LinearBackend
from diffserve.layers.linear.module import Linear
from diffserve.layers.linear.registry import select_linear_backend
from diffserve.layers.observe import KernelObserver


@dataclass
class KernelSet:
    """The backends one model is built with, plus the counters its modules report to.

    ``batch_invariant``: every ``Linear`` and ``Attention`` made here calls its backend
    once per sample of the batch (``layers/per_sample.py``), so a sample's result never
    depends on the batch it runs in."""

    linear_backend: LinearBackend
    attention_backends: dict[str, AttentionBackend]
    counters: KernelCounters = field(default_factory=KernelCounters)
    batch_invariant: bool = True

    def make_linear(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        activation: str | None = None,
        activation_from: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> Linear:
        return Linear(
            in_features,
            out_features,
            bias,
            backend=self.linear_backend,
            counters=self.counters,
            per_sample=self.batch_invariant,
            activation=activation,
            activation_from=activation_from,
            device=device,
            dtype=dtype,
        )

    def make_attention(self, role: str) -> Attention:
        return Attention(
            role,
            backend=self.attention_backends[role],
            counters=self.counters,
            per_sample=self.batch_invariant,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "linear": self.linear_backend.name,
            "attention": {role: b.name for role, b in self.attention_backends.items()},
        }


def build_kernel_set(
    linear_backend: str,
    attention_backend: AttentionBackendConfig,
    *,
    roles: Sequence[str],
    device: torch.device | str,
    dtype: torch.dtype,
    observers: Sequence[KernelObserver] = (),
    batch_invariant: bool = True,
) -> KernelSet:
    """Select the linear backend and one attention backend per role (``roles`` are the
    model's), then let each observer see (and possibly wrap) every selection.
    ``batch_invariant``: the modules made from the set run one backend call per sample
    (the stage's ``batch_invariant``)."""
    unknown = sorted(set(attention_backend.roles) - set(roles))
    if unknown:
        raise ConfigError(
            f"unknown attention role(s) {unknown}",
            path="attention_backend",
            hint=f"roles of this model: default, {', '.join(roles)}",
        )

    def observed(kind: str, requested: str, backend: Any) -> Any:
        for observer in observers:
            backend = observer.on_select(kind, requested, backend)  # type: ignore[arg-type]
        return backend

    linear = observed(
        "linear", linear_backend, select_linear_backend(linear_backend, device, dtype)
    )
    chosen: dict[str, AttentionBackend] = {}
    by_name: dict[str, AttentionBackend] = {}
    for role in roles:
        name = attention_backend.roles.get(role, attention_backend.default)
        # Roles asking for the same name share one backend object (one selection, one
        # record).
        if name not in by_name:
            by_name[name] = observed(
                "attention", name, select_attention_backend(name, device, dtype)
            )
        chosen[role] = by_name[name]
    return KernelSet(linear, chosen, batch_invariant=batch_invariant)
