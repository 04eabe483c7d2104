"""Per-request LoRA inside our ``Linear``: the batch's adapters applied unmerged, as one
low-rank pair.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class LoraState:
    """Shared by one model's patched layers: whether the running batch applies adapters,
    and which."""

    active: bool = False
    # For the attestation.
    adapters: tuple[tuple[str, float], ...] = field(default_factory=tuple)


def delta(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(x A^T) B^T``: the weighted sum of the batch's adapters' low-rank updates."""
    return F.linear(F.linear(x, a), b)
