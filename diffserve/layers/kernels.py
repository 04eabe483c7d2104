"""Resolve a stage's kernel choice (linear backend, per-role attention backends) into backend objects.

A model asks this once at construction for a ``KernelSet`` and builds every ``Linear``/``Attention``
from it, so the choice is made exactly once and recorded on each module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from diffserve.errors import ConfigError
from diffserve.layers import attention as attention_pkg
from diffserve.layers import linear as linear_pkg
from diffserve.layers.attention.base import AttentionBackend
from diffserve.layers.attention.module import Attention
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear.base import LinearBackend
from diffserve.layers.linear.module import Linear


def attention_choice(spec: Any) -> tuple[str, dict[str, str]]:
    """Normalize an attention backend spec to ``(default, {role: name})``.

    Accepts a name (``"sdpa"``), a mapping (``{"default": "sdpa", "single_block": "math"}``) or an
    object with ``.default`` and ``.roles`` (the config's ``AttentionBackendConfig``).
    """
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping):
        roles = {str(k): str(v) for k, v in spec.items() if k != "default"}
        return str(spec.get("default", "auto")), roles
    if hasattr(spec, "default"):
        return str(spec.default), {str(k): str(v) for k, v in dict(getattr(spec, "roles", None) or {}).items()}
    raise ConfigError(f"attention_backend must be a name, a mapping or a config object, got {spec!r}",
                      path="attention_backend")


@dataclass
class KernelSet:
    """The backends one model is built with, plus the counters its modules report to."""

    linear_backend: LinearBackend
    attention_backends: dict[str, AttentionBackend]
    counters: KernelCounters = field(default_factory=KernelCounters)

    def make_linear(self, in_features: int, out_features: int, bias: bool = True, *, rowwise: bool = False,
                    device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Linear:
        return Linear(in_features, out_features, bias, backend=self.linear_backend, counters=self.counters,
                      rowwise=rowwise, device=device, dtype=dtype)

    def make_attention(self, role: str) -> Attention:
        return Attention(role, backend=self.attention_backends[role], counters=self.counters)

    def describe(self) -> dict[str, Any]:
        return {"linear": self.linear_backend.name,
                "attention": {role: b.name for role, b in self.attention_backends.items()}}


def build_kernel_set(linear_backend: str, attention_backend: Any, *, roles: Sequence[str],
                     device: torch.device | str, dtype: torch.dtype) -> KernelSet:
    """Select the linear backend and one attention backend per role (``roles`` are the model's)."""
    default, per_role = attention_choice(attention_backend)
    unknown = sorted(set(per_role) - set(roles))
    if unknown:
        raise ConfigError(f"unknown attention role(s) {unknown}", path="attention_backend",
                          hint=f"roles of this model: default, {', '.join(roles)}")
    # Looked up through the package at build time so a test can patch the select functions.
    linear = linear_pkg.select_linear_backend(linear_backend, device, dtype)
    chosen: dict[str, AttentionBackend] = {}
    for role in roles:
        name = per_role.get(role, default)
        # Roles asking for the same name share one backend object (one selection, one record).
        shared = next((b for r, b in chosen.items() if per_role.get(r, default) == name), None)
        chosen[role] = shared or attention_pkg.select_attention_backend(name, device, dtype)
    return KernelSet(linear, chosen)
