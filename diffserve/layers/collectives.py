"""Counted collectives: the one place a model calls ``torch.distributed`` during a
forward.

Every parallel dimension (CFG-parallel in ``models/flux/pipeline.py``, Ulysses sequence
parallelism in ``layers/ulysses.py``) exchanges tensors through these helpers, so the
attestation can prove that a parallel layout really communicated: each call adds one
call and the bytes this rank *sent* to a ``CollectiveCounters`` under its kind
(``all_gather``, ``all_to_all``, ``all_reduce``). Ranks count their own; the worker sums
the ranks at the end of a batch (``worker/distributed.py``).

``counters`` may be ``None`` (not counted), a ``CollectiveCounters``, or any object with
a ``collectives`` attribute holding one (a ``layers.attestation.KernelCounters``), so
call sites can pass the transformer's counters they already hold. A paused
``KernelCounters`` (warmup) pauses these too. A ``group`` of ``None`` is the default
(world) group, as in ``torch.distributed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "CollectiveCounters",
    "all_gather_into",
    "all_reduce_max",
    "all_to_all_single",
]


class CollectiveCounters:
    """Calls and bytes sent per collective kind: ``{"all_gather": {"calls": n, "bytes":
    b}}``."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}

    def count(self, kind: str, nbytes: int, calls: int = 1) -> None:
        entry = self.counts.setdefault(kind, {"calls": 0, "bytes": 0})
        entry["calls"] += calls
        entry["bytes"] += nbytes

    def __call__(self, kind: str, nbytes: int) -> None:
        """The ``(kind, nbytes)`` callback form, for code that takes a plain counting
        callable."""
        self.count(kind, nbytes)

    def add(self, tally: Mapping[str, Mapping[str, int]]) -> None:
        """Add a ``snapshot()``-shaped tally (another rank's counts)."""
        for kind, entry in tally.items():
            self.count(kind, int(entry.get("bytes", 0)), int(entry.get("calls", 0)))

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {kind: dict(entry) for kind, entry in self.counts.items()}

    def reset(self) -> None:
        self.counts.clear()


def _count(counters: Any, kind: str, tensor: Tensor) -> None:
    if counters is None:
        return
    # A paused KernelCounters: warmup is not reported.
    if getattr(counters, "active", True) is False:
        return
    target = (
        counters if isinstance(counters, CollectiveCounters) else counters.collectives
    )
    target.count(kind, tensor.numel() * tensor.element_size())


def all_gather_into(tensor: Tensor, group: Any, counters: Any = None) -> Tensor:
    """Gather ``tensor`` (same shape and dtype on every rank of ``group``) from every
    rank.

    Returns a new tensor of shape ``[group_size, *tensor.shape]`` whose row ``i`` is
    group rank ``i``'s tensor, identical on every rank. The list form of ``all_gather``
    is used because gloo has no ``all_gather_into_tensor``; the stack is one copy.
    Counted as ``all_gather`` with this rank's bytes.
    """
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor, group=group)
    _count(counters, "all_gather", tensor)
    return torch.stack(parts)


def all_to_all_single(
    output: Tensor, input: Tensor, group: Any, counters: Any = None
) -> Tensor:
    """Scatter equal chunks of ``input`` along dim 0 to the ranks of ``group`` and
    gather theirs into ``output`` (``torch.distributed.all_to_all_single`` with even
    splits): chunk ``i`` of ``input`` goes to group rank ``i``, chunk ``j`` of
    ``output`` comes from group rank ``j``. ``output`` must have ``input``'s shape and
    dtype; it is returned. Counted as ``all_to_all`` with this rank's bytes."""
    input = input.contiguous()
    dist.all_to_all_single(output, input, group=group)
    _count(counters, "all_to_all", input)
    return output


def all_reduce_max(
    value: int,
    group: Any = None,
    counters: Any = None,
    device: torch.device | str = "cpu",
) -> int:
    """The maximum of ``value`` over ``group`` (a control decision every rank must
    share, e.g. stop the batch after this step). ``device`` must be the rank's device on
    nccl. Counted as ``all_reduce``."""
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    _count(counters, "all_reduce", tensor)
    return int(tensor.item())


def all_reduce_sum(tensor: Tensor, group: Any, counters: Any = None) -> Tensor:
    """``tensor`` summed over ``group`` (in place, returned): partial statistics of a
    sharded sequence that every rank must see whole, e.g. the step cache's signal under
    Ulysses. Counted as ``all_reduce``."""
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    _count(counters, "all_reduce", tensor)
    return tensor
