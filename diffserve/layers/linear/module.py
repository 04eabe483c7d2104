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
        # Per-row mode (``LoraState.rows``): one pair per adapter set of the batch
        # (``set_lora_rows``), and the zero pair a row alone would carry where its set
        # does not target this layer.
        self.lora_slots: tuple[lora.LoraPair | None, ...] = ()
        self.lora_zero: lora.LoraPair | None = None
        # Compiled stages' per-row mode: the slots stacked (``lora.stack_pairs``).
        self.lora_stack: lora.LoraStack | None = None
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
        state = self.lora_state
        patched = state is not None and state.active
        if not torch.compiler.is_compiling():
            self.counters.count_linear(self.backend_name)
            if patched:
                # Per-row mode has at least one row with adapters (an all-base batch
                # deactivates), so this is still "the call added a delta".
                self.counters.count_lora()
        # The stacked check comes first and reads only tensors: a compiled graph never
        # guards on the row layout.
        if patched and state is not None and self.lora_stack is not None:
            return self._run_stacked(x, state)
        if patched and state is not None and state.rows is not None:
            return self._run_rows(x, state.rows, state)
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
        self.lora_a, self.lora_b = self.lora_factors(a, b)
        self._drop_rows()
        self.lora_state = state

    def lora_factors(
        self, a: torch.Tensor | None, b: torch.Tensor | None
    ) -> lora.LoraPair:
        """``a``, ``b`` as this layer runs them (``None``: the zero rank-1 pair)."""
        # The stage's device, not the weight's: an offloaded block's weight waits in
        # host memory (models/offload.py).
        dtype, device = self.weight.dtype, self.backend.device
        if a is None or b is None:
            a = torch.zeros(1, self.in_features, dtype=dtype, device=device)
            b = torch.zeros(self.out_features, 1, dtype=dtype, device=device)
        return (
            a.to(device=device, dtype=dtype).contiguous(),
            b.to(device=device, dtype=dtype).contiguous(),
        )

    def set_lora_rows(
        self, state: lora.LoraState, slots: tuple[lora.LoraPair | None, ...]
    ) -> None:
        """Install a per-row batch's pairs, one per adapter set (already converted by
        ``lora_factors``; ``None``: that set does not target this layer); ``state.rows``
        says which rows use which."""
        if any(pair is None for pair in slots) and self.lora_zero is None:
            self.lora_zero = self.lora_factors(None, None)
        self._drop_rows()
        self.lora_slots = slots
        self.lora_state = state

    def set_lora_stacked(
        self, state: lora.LoraState, slots: tuple[lora.LoraPair | None, ...]
    ) -> None:
        """``set_lora_rows`` for a compiled stage: the slots stacked, gathered per row
        by ``state.row_index``."""
        if self.lora_zero is None:
            self.lora_zero = self.lora_factors(None, None)
        self._drop_rows()
        self.lora_stack = lora.stack_pairs(slots, self.lora_zero)
        self.lora_state = state

    def _drop_rows(self) -> None:
        # The last per-row batch's factors, whichever form (they hold memory).
        self.lora_slots = ()
        self.lora_stack = None

    def _run_lora(self, x: torch.Tensor) -> torch.Tensor:
        # Active implies installed (set_lora)
        assert self.lora_a is not None and self.lora_b is not None
        return self._run_delta(x, self.lora_a, self.lora_b)

    def _run_delta(
        self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor
    ) -> torch.Tensor:
        # The delta goes in before the activation, so the backend's fused activation is
        # applied after it.
        y = self.backend.linear(x, self.weight, self.bias)
        y = y + lora.delta(x, a, b)
        return activate(y, self.activation, self.activation_from)

    def _run_rows(
        self, x: torch.Tensor, rows: tuple[int, ...], state: lora.LoraState
    ) -> torch.Tensor:
        _check_rows(x, len(rows))
        if self.per_sample:
            # Each row exactly as its request alone: a base row through the un-patched
            # path, an adapter row through its own set's pair (the zero pair where
            # alone it carries one).
            return torch.cat(
                [
                    self._run(x[i : i + 1])
                    if slot == lora.BASE_ROW
                    else self._run_delta(
                        x[i : i + 1], *(self.lora_slots[slot] or self._zero())
                    )
                    for i, slot in enumerate(rows)
                ]
            )
        # One base GEMM for the batch, the deltas grouped by adapter set, then the
        # activation (unfused for every row: base rows may differ from alone in their
        # last bits, as any row of a batch without per_sample may).
        y = self.backend.linear(x, self.weight, self.bias)
        y = lora.delta_rows(y, x, state, self.lora_slots)
        return activate(y, self.activation, self.activation_from)

    def _run_stacked(self, x: torch.Tensor, state: lora.LoraState) -> torch.Tensor:
        index, stack = state.row_index, self.lora_stack
        # Installed together (set_lora_stacked, activate_rows)
        assert index is not None and stack is not None
        if not torch.compiler.is_compiling():  # a traced graph would guard on it
            _check_rows(x, index.shape[0])
        a, b = stack.a.index_select(0, index), stack.b.index_select(0, index)
        if self.per_sample and x.shape[0] > 1:
            return each_sample(self._run_gathered, x, a, b)
        return self._run_gathered(x, a, b)

    def _run_gathered(
        self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor
    ) -> torch.Tensor:
        y = self.backend.linear(x, self.weight, self.bias)
        y = y + lora.delta_gathered(x, a, b)
        return activate(y, self.activation, self.activation_from)

    def _zero(self) -> lora.LoraPair:
        assert self.lora_zero is not None  # made by set_lora_rows
        return self.lora_zero

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, backend={self.backend_name}"
            + (", per_sample" if self.per_sample else "")
            + (f", activation={self.activation}" if self.activation else "")
            + (f" from column {self.activation_from}" if self.activation_from else "")
        )


def _check_rows(x: torch.Tensor, rows: int) -> None:
    # A layer whose dim 0 is not the forward's batch would mix rows up silently.
    if x.shape[0] != rows:
        raise ValueError(
            f"per-row LoRA for {rows} rows, but this layer's input has {x.shape[0]} "
            "(LoraAdapters.activate_rows needs one set per row of the forward's batch)"
        )
