"""Put a diffusers denoiser on diffserve's kernels: every ``nn.Linear`` becomes our
``Linear`` (sharing the loaded weight and bias, not copying them) and every attention
call goes to our ``Attention``.

Attention seam: diffusers' attention modules (``Attention``, ``FluxAttention``...) call
``torch.nn.functional.scaled_dot_product_attention`` from whichever processor they
carry, directly or through diffusers' dispatcher. Rather than re-implementing each
processor, each attention module's class is swapped for a subclass whose ``forward``
runs the original under ``SdpaRedirect``, a torch function mode that hands exactly those
calls to the module's ``Attention`` (its role's backend, counted). Everything else the
processor does (projections, norms, RoPE, masks) stays diffusers' code.
``torch.compile`` traces through the mode, so a compiled block calls the same backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from diffserve.errors import ConfigError
from diffserve.layers.attention.module import Attention
from diffserve.layers.kernels import KernelSet

_SDPA = F.scaled_dot_product_attention
_ROUTED: dict[type, type] = {}  # diffusers attention class -> its routed subclass


class SdpaRedirect(TorchFunctionMode):
    """Inside it, ``scaled_dot_product_attention(q, k, v, attn_mask)`` runs on
    ``attention`` instead; every other torch call passes through untouched. A call our
    backends cannot express (causal, dropout, a non-default scale) is an error rather
    than a silent fallback: the attestation must stay true."""

    def __init__(self, attention: Attention) -> None:
        super().__init__()
        self.attention = attention

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is not _SDPA:
            return func(*args, **kwargs)
        return self._attend(*args, **kwargs)

    def _attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if (
            is_causal
            or dropout_p
            or enable_gqa
            or (scale is not None and scale != query.shape[-1] ** -0.5)
        ):
            raise NotImplementedError(
                f"attention call with is_causal={is_causal}, dropout_p={dropout_p}, "
                f"enable_gqa={enable_gqa}, "
                f"scale={scale}: diffserve's attention backends run "
                "non-causal attention at the default scale"
            )
        batch, heads, length, dim = query.shape
        out = self.attention(query, key, value, attn_mask)  # [B, L, H * D]
        # What the processor expects.
        return out.view(batch, length, heads, dim).transpose(1, 2)


def swap_linears(module: nn.Module, kernels: KernelSet) -> int:
    """Replace every ``nn.Linear`` under ``module`` with our ``Linear`` on the same
    parameters; returns how many were replaced."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            linear = kernels.make_linear(
                child.in_features,
                child.out_features,
                child.bias is not None,
                device="meta",
                dtype=child.weight.dtype,
            )
            linear.weight = child.weight  # type: ignore[assignment]  # the loaded Parameter itself, shared
            linear.bias = child.bias
            setattr(parent, name, linear)
            replaced += 1
    return replaced


def route_attention(
    module: nn.Module, kernels: KernelSet, role_patterns: Sequence[tuple[str, str]]
) -> dict[str, str]:
    """Give every diffusers attention module under ``module`` an ``Attention`` of its
    role (the first ``(substring of its path, role)`` that matches) and route its SDPA
    calls there. Returns path -> role."""
    roles: dict[str, str] = {}
    for path, child in list(module.named_modules()):
        if not _is_attention_module(child):
            continue
        role = next((r for pattern, r in role_patterns if pattern in f"{path}."), None)
        if role is None:
            raise ConfigError(
                f"attention module {path!r} matches no attention role of this model",
                path="registry.models.role_patterns",
                hint="add a pattern for it to the family's role_patterns",
            )
        # A submodule: tallies and repr see it.
        child.diffserve_attention = kernels.make_attention(role)
        child.__class__ = _routed_class(type(child))
        roles[path] = role
    if not roles:
        raise ConfigError(
            f"{type(module).__name__} has no diffusers attention module to route",
            path="model",
            hint="the generic path serves diffusers DiT denoisers",
        )
    return roles


def _is_attention_module(module: nn.Module) -> bool:
    # diffusers' attention modules carry a swappable processor (Attention,
    # FluxAttention, AttentionModuleMixin).
    return (
        hasattr(module, "processor")
        and hasattr(module, "set_processor")
        and not isinstance(module, Attention)
    )


def _routed_class(cls: type[nn.Module]) -> type:
    if cls not in _ROUTED:

        def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            with SdpaRedirect(self.diffserve_attention):
                return cls.forward(self, *args, **kwargs)

        _ROUTED[cls] = type(
            f"Routed{cls.__name__}",
            (cls,),
            {"forward": forward, "__module__": __name__},
        )
    return _ROUTED[cls]


def check_masked_roles(
    kernels: KernelSet, masked_roles: Sequence[str], stage_id: int
) -> None:
    """Roles whose calls carry a padding mask need a backend that takes one (flash_attn
    does not)."""
    for role in masked_roles:
        backend = kernels.attention_backends[role]
        if not getattr(backend, "supports_mask", True):
            raise ConfigError(
                f"attention role {role!r} passes a padding mask, which "
                f"the {backend.name!r} "
                "backend cannot take",
                path=f"stages.{stage_id}.attention_backend.{role}",
                hint="choose sdpa or math for this role",
            )
