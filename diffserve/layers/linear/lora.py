"""Per-request LoRA inside our ``Linear``: the batch's adapters applied unmerged, as one
low-rank pair, or one pair per row (a batch whose rows carry different adapters).

When a batch starts, every ``Linear`` an adapter targets gets the batch's combined
factors: ``lora_a`` ``[r_1 + ... + r_k, in]`` (each adapter's ``A`` stacked) and
``lora_b`` ``[out, r_1 + ... + r_k]`` (each adapter's ``B`` times its scale, side by
side), in the request's canonical adapter order. The delta is then

    y = x W^T + b + (x A^T) B^T  =  x W^T + b + sum_i s_i (x A_i^T) B_i^T

two small GEMMs whatever the number of adapters, sized by their real ranks. A layer that
none of the batch's adapters targets (but an earlier batch's did) gets a zero rank-1
pair, so the set of patched layers never changes a compiled graph's structure. The base
weight is never modified: a base batch (``active`` false) runs exactly the base model.
The factors depend only on the batch's adapter set, never on which adapters were loaded
before, so an image is the same whatever ran before it.

Per-row mode (``LoraState.rows`` set): each distinct adapter set of the batch is a
*slot* holding that set's combined pair (built exactly as for the set alone), and each
row names its slot (``-1``: the base model, no delta). One sample at a time
(``per_sample``) a row then computes exactly as its request alone; otherwise the batch
shares one base GEMM and each slot's rows get their delta from two GEMMs over just those
rows (``delta_rows``). That Python-level layout would specialize a compiled graph on
every row layout (and soon exceed dynamo's recompile limit), so a compiled stage
installs the slots stacked instead (``stack_pairs``: zero-padded to one rank, slot 0 the
base model's zero pair) and each row gathers its own pair by a row index tensor
(``delta_gathered``): the graph sees only tensors, marked dynamic and held outside the
module's buffers (dynamo keeps buffer shapes static), so one graph serves every layout.
No bit-identity is claimed there (compiled blocks never claim it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# A combined ``(A [rank, in], B [out, rank])``; ``None`` in a slot: that set does not
# target the layer (alone, the layer would carry a zero rank-1 pair).
LoraPair = tuple[torch.Tensor, torch.Tensor]
BASE_ROW = -1


@dataclass
class LoraState:
    """Shared by one model's patched layers: whether the running batch applies adapters,
    and which."""

    active: bool = False
    # For the attestation (one set for the batch; per-row batches are attested per
    # request by ``LoraAdapters.describe``).
    adapters: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    # Per-row mode: each row's slot in the layers' ``lora_slots`` (``BASE_ROW``: no
    # delta); ``None``: one pair for the whole batch (``lora_a``/``lora_b``).
    rows: tuple[int, ...] | None = None
    # Stacked per-row mode (compiled stages): each row's index into the layers'
    # ``lora_stack`` (0: the base model), on the stage's device.
    row_index: torch.Tensor | None = None
    # Each slot's rows as index tensors, per device (built once per row layout, not
    # once per layer call).
    _groups: dict[torch.device, tuple[tuple[int, torch.Tensor], ...]] = field(
        default_factory=dict, repr=False
    )

    def set_rows(
        self, rows: tuple[int, ...] | None, row_index: torch.Tensor | None = None
    ) -> None:
        """Switch to per-row mode with ``rows`` (``None``: back to one pair), stacked
        when ``row_index`` is given."""
        if row_index is not None:
            torch._dynamo.maybe_mark_dynamic(row_index, 0)
        self.rows = rows
        self.row_index = row_index
        self._groups = {}

    @contextmanager
    def narrow(self, rows: Sequence[int]) -> Iterator[None]:
        """Forwards on only ``rows`` of the batch (a step cache runs its blocks for
        the rows that compute): the per-row layout follows them, and comes back after.
        One pair for every row needs nothing."""
        if self.rows is None:
            yield
            return
        saved = (self.rows, self.row_index, self._groups)
        index = (
            None
            if self.row_index is None
            else self.row_index[torch.tensor(list(rows), device=self.row_index.device)]
        )
        self.set_rows(tuple(self.rows[i] for i in rows), index)
        try:
            yield
        finally:
            self.rows, self.row_index, self._groups = saved

    def groups(self, device: torch.device) -> tuple[tuple[int, torch.Tensor], ...]:
        """``(slot, indices of its rows)`` for every slot in use, indices on
        ``device``."""
        assert self.rows is not None  # per-row mode only
        built = self._groups.get(device)
        if built is None:
            slots = sorted({s for s in self.rows if s != BASE_ROW})
            built = tuple(
                (
                    slot,
                    torch.tensor(
                        [i for i, s in enumerate(self.rows) if s == slot],
                        dtype=torch.long,
                        device=device,
                    ),
                )
                for slot in slots
            )
            self._groups[device] = built
        return built


def delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(x A^T) B^T``: the weighted sum of the batch's adapters' low-rank updates."""
    return F.linear(F.linear(x, a), b)


def delta_rows(
    y: torch.Tensor,
    x: torch.Tensor,
    state: LoraState,
    slots: tuple[LoraPair | None, ...],
) -> torch.Tensor:
    """``y`` (the whole batch's base output, a fresh GEMM output, before any activation)
    plus each row's own delta, in place: per slot, its rows of ``x`` through that slot's
    pair, added back into the same rows. A slot whose set does not target the layer is
    skipped (alone it adds a zero pair: at most a zero's sign differs)."""
    for slot, index in state.groups(x.device):
        pair = slots[slot]
        if pair is not None:
            # Each row appears once per slot, so every element gets exactly one add:
            # the same ``y + delta`` as the row alone, and deterministic on CUDA.
            y.index_add_(0, index, delta(x.index_select(0, index), *pair))
    return y


@dataclass
class LoraStack:
    """A layer's per-row slots stacked: ``a`` ``[1 + slots, rank, in]``, ``b`` ``[1 +
    slots, out, rank]``. A plain object, not buffers: a compiled graph then treats its
    shapes as dynamic."""

    a: torch.Tensor
    b: torch.Tensor


def stack_pairs(pairs: tuple[LoraPair | None, ...], zero: LoraPair) -> LoraStack:
    """The slots stacked, each zero-padded to the widest rank (extra rank columns add
    exact zeros), slot 0 ``zero`` (base rows; also a slot that does not target the
    layer)."""
    slots = [zero, *(pair or zero for pair in pairs)]
    # At least 2: dynamo specializes a dimension of size 1, so a layer whose slots are
    # all zero pairs would compile a graph of its own.
    rank = max(2, *(a.shape[0] for a, _ in slots))
    a_all = zero[0].new_zeros(len(slots), rank, zero[0].shape[1])
    b_all = zero[1].new_zeros(len(slots), zero[1].shape[0], rank)
    for i, (a, b) in enumerate(slots):
        a_all[i, : a.shape[0]] = a
        b_all[i, :, : b.shape[1]] = b
    # Slot count and rank vary with the batch: one graph for all of them.
    for tensor, dims in ((a_all, (0, 1)), (b_all, (0, 2))):
        for dim in dims:
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    return LoraStack(a_all, b_all)


def delta_gathered(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Each row's own delta: ``x`` ``[rows, ..., in]``, its pair gathered per row
    (``a`` ``[rows, rank, in]``, ``b`` ``[rows, out, rank]``), two batched GEMMs."""
    x3 = x.reshape(x.shape[0], -1, x.shape[-1])
    d = torch.bmm(torch.bmm(x3, a.transpose(1, 2)), b.transpose(1, 2))
    return d.reshape(*x.shape[:-1], b.shape[1])
