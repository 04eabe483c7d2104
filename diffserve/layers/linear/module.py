"""``Linear``: an ``nn.Linear``-shaped module whose kernel is a backend object fixed at
construction."""

from __future__ import annotations

import math

import torch
from torch import nn

from diffserve.layers.attestation import KernelCounters
from diffserve.layers.linear import lora
from diffserve.layers.linear.base import ACTIVATIONS, LinearBackend, activate
from diffserve.layers.per_sample import each_sample


class Linear(nn.Module):
    """``y = x @ weight.T + bias`` through ``backend.linear``; each call is counted
    under ``backend_name``.

    The backend method is looked up on every call (never captured), so a patched backend
    class is seen.

    ``per_sample=True`` (a ``batch_invariant`` kernel set, ``layers/per_sample.py``):
    each sample of the batch (dim 0: an image's tokens ``[1, L, in]`` or its
    conditioning vector ``[1, in]``) is multiplied in its own backend call, so no GEMM's
    shape depends on the batch and an image never changes with the batch it runs in. It
    is still one counted call.

    ``activation`` (a name in ``linear.base.ACTIVATIONS``, e.g. ``"gelu_tanh"``) is
    applied to the output by the backend (``backend.linear(x, weight, bias,
    activation)``), which may fuse it into its GEMM; with ``activation_from`` > 0 only
    to output columns ``activation_from:`` (a merged projection whose head stays
    linear: ``backend.linear(..., activation, activation_from)``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        backend: LinearBackend,
        counters: KernelCounters,
        per_sample: bool = False,
        activation: str | None = None,
        activation_from: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}"
            )
        if not 0 <= activation_from < out_features or (
            activation_from and activation is None
        ):
            raise ValueError(
                f"activation_from={activation_from} needs an activation and must be "
                f"below out_features={out_features}"
            )
        self.per_sample = per_sample
        self.activation = activation
        self.activation_from = activation_from
        self.in_features = in_features
        self.out_features = out_features
        self.backend = backend
        self.backend_name = backend.name
        self.counters = counters
        # Per-request LoRA (``layers/linear/lora.py``): the running batch's combined
        # factors, installed by ``set_lora`` once an adapter targets this layer; never
        # part of the state dict.
        self.lora_state: lora.LoraState | None = None
        self.lora_a: torch.Tensor | None
        self.lora_b: torch.Tensor | None
        self.register_buffer("lora_a", None, persistent=False)
        self.register_buffer("lora_b", None, persistent=False)
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, device=device, dtype=dtype)
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
            if bias
            else None
        )
        if self.weight.device.type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        # Same init as nn.Linear, so a freshly built module is usable without weights
        # (tests).
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Inside a torch.compile graph the Python increment would be traced away or
        # force a recompile; compiled blocks are counted by their owner from a static
        # tally instead.
        patched = self.lora_state is not None and self.lora_state.active
        if not torch.compiler.is_compiling():
            self.counters.count_linear(self.backend_name)
            if patched:
                self.counters.count_lora()
        run = self._run_lora if patched else self._run
        if self.per_sample and x.shape[0] > 1:
            return each_sample(run, x)
        return run(x)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation is None:
            return self.backend.linear(x, self.weight, self.bias)
        if self.activation_from:
            return self.backend.linear(
                x, self.weight, self.bias, self.activation, self.activation_from
            )
        return self.backend.linear(x, self.weight, self.bias, self.activation)

    def set_lora(
        self, state: lora.LoraState, a: torch.Tensor | None, b: torch.Tensor | None
    ) -> None:
        """Install the batch's combined ``A`` ``[rank, in]`` and scaled ``B`` ``[out,
        rank]`` (``None``: a zero rank-1 pair: this batch's adapters do not touch the
        layer), shared ``state`` saying whether they apply."""
        # The stage's device, not the weight's: an offloaded block's weight waits in
        # host memory (models/offload.py).
        dtype, device = self.weight.dtype, self.backend.device
        if a is None or b is None:
            a = torch.zeros(1, self.in_features, dtype=dtype, device=device)
            b = torch.zeros(self.out_features, 1, dtype=dtype, device=device)
        self.lora_a = a.to(device=device, dtype=dtype).contiguous()
        self.lora_b = b.to(device=device, dtype=dtype).contiguous()
        self.lora_state = state

    def _run_lora(self, x: torch.Tensor) -> torch.Tensor:
        # The delta goes in before the activation, so the backend's fused activation is
        # applied after it.
        # Active implies installed (set_lora)
        assert self.lora_a is not None and self.lora_b is not None
        y = self.backend.linear(x, self.weight, self.bias)
        y = y + lora.delta(x, self.lora_a, self.lora_b)
        return activate(y, self.activation, self.activation_from)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, backend={self.backend_name}"
            + (", per_sample" if self.per_sample else "")
            + (f", activation={self.activation}" if self.activation else "")
            + (f" from column {self.activation_from}" if self.activation_from else "")
        )
