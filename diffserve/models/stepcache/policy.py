"""The decision rules of a step cache and the state of one CFG branch over the rows of a batch.

Every row (image) decides alone, from its own signal and history, so image i of a batch is exactly the
image it would be alone. The rules, for both backends (higher threshold = more skipping):
- steps ``0 .. warmup_steps-1`` and the last step always compute; so does a step whose row has no
  reference yet, or that already skipped ``max_consecutive_skips`` steps in a row (0 = no limit);
- fbcache: skip while ``signal < threshold``; the signal is the relative mean absolute difference of
  block 0's residual from the one of the last COMPUTED step (ParaAttention);
- teacache: ``acc += rescale(signal)``, skip while ``acc < threshold``, reset ``acc`` on every computed
  step; the signal compares block 0's modulated input with the PREVIOUS step's (TeaCache4FLUX).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from diffserve.layers.collectives import all_reduce_sum
from diffserve.models.stepcache.teacache import rescale

COMPUTE, SKIP = "compute", "skip"


@dataclass(frozen=True)
class CacheSettings:
    """The stage's cache backend and rules with one batch's threshold (0 = off for that batch)."""

    backend: str = "none"
    threshold: float = 0.0
    warmup_steps: int = 1
    max_consecutive_skips: int = 0

    @property
    def enabled(self) -> bool:
        return self.backend != "none" and self.threshold > 0


class BranchCache:
    """One CFG branch's cache over ``rows`` image rows for a ``total_steps`` schedule.

    ``group`` is the Ulysses group when the rows' tokens are sharded over ranks: the signal's sums are
    then all-reduced so every rank of the group takes the same decisions (one tiny collective per step).
    """

    def __init__(self, settings: CacheSettings, rows: int, total_steps: int, *, group: Any = None,
                 counters: Any = None) -> None:
        self.settings = settings
        self.total_steps = total_steps
        self.group = group
        self.counters = counters
        self.reference: Tensor | None = None  # fbcache: block-0 residual; teacache: the modulated input
        self.residual: Tensor | None = None  # cached output - input of the blocks the cache skips
        self.accumulated = [0.0] * rows
        self.run_of_skips = [0] * rows
        self.trace: list[list[list[Any]]] = [[] for _ in range(rows)]

    # -- decisions ----------------------------------------------------------------------------------

    def decide(self, step: int, probe: Tensor) -> list[bool]:
        """Whether each row computes at ``step`` (0-based), from this step's ``probe`` [rows, ...]."""
        signals = self._signals(probe)
        compute = []
        for row, signal in enumerate(signals):
            value = signal
            if signal is not None and self.settings.backend == "teacache":
                value = self.accumulated[row] + rescale(signal)
            skip = not self._forced(step, row, signal) and value is not None and value < self.settings.threshold
            if self.settings.backend == "teacache":
                self.accumulated[row] = value if skip and value is not None else 0.0
            self.run_of_skips[row] = self.run_of_skips[row] + 1 if skip else 0
            self.trace[row].append([step + 1, None if value is None else round(float(value), 6),
                                    SKIP if skip else COMPUTE])
            compute.append(not skip)
        self._update_reference(probe, compute)
        return compute

    def _forced(self, step: int, row: int, signal: float | None) -> bool:
        cap = self.settings.max_consecutive_skips
        return (signal is None or step < self.settings.warmup_steps or step == self.total_steps - 1
                or (cap > 0 and self.run_of_skips[row] >= cap))

    def _signals(self, probe: Tensor) -> list[float | None]:
        """``sum|probe - reference| / sum|reference|`` per row, in float64, one row at a time (a row's sum
        must not depend on which other rows share the batch); summed over the Ulysses group first."""
        if self.reference is None:
            return [None] * probe.shape[0]
        sums = torch.stack([torch.stack((torch.sum((probe[i] - self.reference[i]).abs(), dtype=torch.float64),
                                         torch.sum(self.reference[i].abs(), dtype=torch.float64)))
                            for i in range(probe.shape[0])])
        if self.group is not None:
            sums = all_reduce_sum(sums, self.group, self.counters)
        return [float(d / r) if r > 0 else None for d, r in sums.tolist()]

    def _update_reference(self, probe: Tensor, compute: list[bool]) -> None:
        if self.reference is None or self.settings.backend == "teacache":
            self.reference = probe  # teacache compares consecutive steps, computed or not
            return
        for row, computed in enumerate(compute):
            if computed:  # fbcache compares with the last computed step (ParaAttention)
                self.reference[row] = probe[row]

    # -- residuals ----------------------------------------------------------------------------------

    def apply(self, compute: list[bool], base: Tensor, run_blocks: Callable[[Tensor | None], Tensor]) -> Tensor:
        """The blocks' output for every row: ``run_blocks(rows)`` on the computing rows (``None`` = all
        of them), ``base + cached residual`` on the others; refreshes the residual of computed rows."""
        if all(compute):
            out = run_blocks(None)
            self.residual = out - base
            return out
        rows = [i for i, c in enumerate(compute) if c]
        skipped = torch.tensor([i for i, c in enumerate(compute) if not c], device=base.device)
        out = torch.empty_like(base)
        assert self.residual is not None, "a row skipped before any step was computed"
        out[skipped] = base[skipped] + self.residual[skipped]
        if rows:
            index = torch.tensor(rows, device=base.device)
            computed = run_blocks(index)
            self.residual[index] = computed - base[index]
            out[index] = computed
        return out

    # -- report -------------------------------------------------------------------------------------

    def report(self, row: int) -> dict[str, Any]:
        """``{computed_steps, skipped_steps, trace}`` of one row: ``trace`` is ``[step, signal, decision]``
        per step (1-based), ``signal`` the value compared with the threshold (``None`` without one)."""
        trace = self.trace[row]
        skipped = sum(1 for _, _, decision in trace if decision == SKIP)
        return {"computed_steps": len(trace) - skipped, "skipped_steps": skipped, "trace": [list(t) for t in trace]}
