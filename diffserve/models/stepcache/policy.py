"""The decision rules of a step cache and the state of one CFG branch over the rows of a
batch.

Every row (image) decides alone, from its own signal and history, so image i of a batch
is exactly the image it would be alone. The rules, for both backends (higher threshold =
more skipping):
- steps ``0 .. warmup_steps-1`` and the last step always compute; so does a step whose
  row has no
  reference or residual yet, or that already skipped ``max_consecutive_skips`` steps in
  a row (0 = no limit);
- fbcache: skip while ``signal < threshold``; the signal is the relative mean absolute
  difference of
  block 0's residual from the one of the last COMPUTED step (ParaAttention);
- teacache: ``acc += rescale(signal)``, skip while ``acc < threshold``, reset ``acc`` on
  every computed
  step, and compute where ``rescale(signal) < 0`` (outside the polynomial's fitted
  range); the signal compares the model's probe (FLUX: block 0's modulated input; Wan:
  the timestep embedding or modulation) with the PREVIOUS step's, rescaled by the
  published polynomial.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from diffserve.config.stage_sections import CacheConfig
from diffserve.layers.collectives import all_reduce_sum
from diffserve.models.stepcache.teacache import FLUX_COEFFICIENTS, rescale
from diffserve.registry.teacache import TeaCachePolynomial
from diffserve.types.attestation import BranchCacheReport

COMPUTE, SKIP = "compute", "skip"


@dataclass(frozen=True)
class CacheSettings:
    """The stage's cache backend and rules with one batch's threshold (0 = off for that
    batch)."""

    backend: str = "none"
    threshold: float = 0.0
    warmup_steps: int = 1
    max_consecutive_skips: int = 0
    # teacache: the published polynomial's name and coefficients (registry/teacache.py)
    polynomial: str = "flux.1-dev"
    coefficients: tuple[float, ...] = FLUX_COEFFICIENTS

    @property
    def enabled(self) -> bool:
        return self.backend != "none" and self.threshold > 0

    @classmethod
    def for_batch(
        cls,
        cache: CacheConfig,
        threshold: float,
        polynomial: TeaCachePolynomial | None = None,
    ) -> CacheSettings:
        """A stage's rules with one batch's threshold; TeaCache keeps its recipe's
        retention steps (Wan2.1-14B's computes its first five) when the stage's
        ``warmup_steps`` asks for fewer."""
        if polynomial is None:
            return cls(
                cache.backend,
                threshold,
                cache.warmup_steps,
                cache.max_consecutive_skips,
            )
        return cls(
            cache.backend,
            threshold,
            max(cache.warmup_steps, polynomial.retention_steps),
            cache.max_consecutive_skips,
            polynomial.name,
            polynomial.coefficients,
        )


@dataclass
class _Row:
    """One image row's cache state: what its signal compares with, its cached residual,
    its history."""

    # The row's own request: its cache slot's threshold (0: the row always computes and
    # reports as uncached) and its step count.
    threshold: float
    total_steps: int
    # Fbcache: block-0 residual; teacache: the modulated input.
    reference: Tensor | None = None
    # Cached output - input of the blocks the cache skips.
    residual: Tensor | None = None
    accumulated: float = 0.0
    run_of_skips: int = 0
    trace: list[list[Any]] = field(default_factory=list)


class BranchCache:
    """One CFG branch's cache over the image rows of a running batch: one cache slot per
    row (its own threshold, step count, reference and residual).

    Rows join (``add_rows``) and leave (``keep_rows``) at step boundaries (step-level
    batching) and may sit at different steps, so one batched call mixes rows that
    compute and rows that reuse. ``group`` is the Ulysses group when the
    rows' tokens are sharded over ranks: the signal's sums are then all-reduced so every
    rank of the group takes the same decisions (one tiny collective per step).
    """

    def __init__(
        self,
        settings: CacheSettings,
        total_steps: int,
        *,
        group: Any = None,
        counters: Any = None,
    ) -> None:
        self.settings = settings
        self.total_steps = total_steps
        self.group = group
        self.counters = counters
        self.rows: list[_Row] = []
        # Per-row state outside the cache that must follow a forward on some rows only
        # (the rows' LoRA adapters: ``LoraState.narrow``), and this cache's rows in the
        # batch's numbering (a view's).
        self.narrow: Callable[[list[int]], AbstractContextManager[None]] | None = None
        self.batch_rows: list[int] | None = None

    def add_rows(
        self, count: int, threshold: float | None = None, total_steps: int | None = None
    ) -> None:
        """Slots for ``count`` joining rows of one request (default: the settings'
        threshold and this cache's step count)."""
        threshold = self.settings.threshold if threshold is None else threshold
        total = self.total_steps if total_steps is None else total_steps
        self.rows += [_Row(threshold, total) for _ in range(count)]

    def threshold(self, row: int) -> float:
        return self.rows[row].threshold

    @property
    def active(self) -> bool:
        """Some row may skip (else the batch runs the plain, uncached forward)."""
        return any(state.threshold > 0 for state in self.rows)

    def view(self, rows: list[int]) -> BranchCache:
        """A cache over some of the rows (their slots shared, not copied): one
        transformer of a mixture of experts runs through it for its rows only."""
        part = BranchCache(
            self.settings, self.total_steps, group=self.group, counters=self.counters
        )
        part.rows = [self.rows[i] for i in rows]
        part.narrow = self.narrow
        part.batch_rows = [self._batch_row(i) for i in rows]
        return part

    def _batch_row(self, row: int) -> int:
        return row if self.batch_rows is None else self.batch_rows[row]

    def keep_rows(self, keep: list[int]) -> None:
        """Keep these rows (old indices, in order): the others' requests left the
        batch."""
        self.rows = [self.rows[i] for i in keep]

    def forget(self, rows: list[int] | None = None) -> None:
        """Drop the reference and cached residual of ``rows`` (None: every row; their
        history stays): their next step computes. For a switch of denoiser
        mid-schedule (Wan2.2's experts), whose residuals must not cross it."""
        for i in range(len(self.rows)) if rows is None else rows:
            state = self.rows[i]
            state.reference, state.residual, state.accumulated = None, None, 0.0

    # -- decisions
    # ----------------------------------------------------------------------------------

    def decide(self, steps: list[int], probe: Tensor) -> list[bool]:
        """Whether each row computes at its step ``steps[row]`` (0-based), from this
        step's ``probe``."""
        signals = self._signals(probe)
        compute = []
        for state, step, signal in zip(self.rows, steps, signals, strict=True):
            value, outside_fit = signal, False
            if signal is not None and self.settings.backend == "teacache":
                rescaled = rescale(signal, self.settings.coefficients)
                # A negative rescaled distance means the probe moved outside the range
                # the polynomial was fitted on (Wan2.1-14B's turns negative past a 0.082
                # change and would then skip every step): compute.
                value, outside_fit = state.accumulated + rescaled, rescaled < 0
            skip = (
                not self._forced(step, state, signal)
                and not outside_fit
                and value is not None
                and value < state.threshold
            )
            if self.settings.backend == "teacache":
                state.accumulated = value if skip and value is not None else 0.0
            state.run_of_skips = state.run_of_skips + 1 if skip else 0
            state.trace.append(
                [
                    step + 1,
                    None if value is None else round(float(value), 6),
                    SKIP if skip else COMPUTE,
                ]
            )
            compute.append(not skip)
            # teacache compares consecutive steps (computed or not); fbcache the last
            # computed step.
            if (
                not skip
                or self.settings.backend == "teacache"
                or state.reference is None
            ):
                state.reference = probe[len(compute) - 1]
        return compute

    def _forced(self, step: int, state: _Row, signal: float | None) -> bool:
        cap = self.settings.max_consecutive_skips
        return (
            signal is None
            or state.residual is None
            or step < self.settings.warmup_steps
            or step == state.total_steps - 1
            or (cap > 0 and state.run_of_skips >= cap)
        )

    def _signals(self, probe: Tensor) -> list[float | None]:
        """``sum|probe - reference| / sum|reference|`` per row, in float64, one row at a
        time (a row's sum must not depend on which other rows share the batch); summed
        over the Ulysses group first."""
        zero = torch.zeros((), dtype=torch.float64, device=probe.device)
        sums = torch.stack(
            [
                torch.stack(
                    (
                        torch.sum(
                            (probe[i] - state.reference).abs(), dtype=torch.float64
                        ),
                        torch.sum(state.reference.abs(), dtype=torch.float64),
                    )
                )
                if state.reference is not None
                else torch.stack((zero, zero))
                for i, state in enumerate(self.rows)
            ]
        )
        # Step 0 (or only new rows) has nothing to compare: no exchange (every rank
        # knows this alike).
        if self.group is not None and any(
            state.reference is not None for state in self.rows
        ):
            sums = all_reduce_sum(sums, self.group, self.counters)
        return [
            float(d / r) if state.reference is not None and r > 0 else None
            for state, (d, r) in zip(self.rows, sums.tolist(), strict=True)
        ]

    # -- residuals
    # ----------------------------------------------------------------------------------

    def apply(
        self,
        compute: list[bool],
        base: Tensor,
        run_blocks: Callable[[Tensor | None], Tensor],
    ) -> Tensor:
        """The blocks' output for every row: ``run_blocks(rows)`` on the computing rows
        (``None`` = all of them), ``base + cached residual`` on the others; refreshes
        the residual of computed rows."""
        rows = [i for i, c in enumerate(compute) if c]
        if len(rows) == len(compute):
            with (
                self.narrow(self.batch_rows)
                if self.narrow is not None and self.batch_rows is not None
                else nullcontext()
            ):
                out = run_blocks(None)
            for state, residual in zip(self.rows, (out - base).unbind(0), strict=True):
                state.residual = residual
            return out
        out = torch.empty_like(base)
        for i, computed in enumerate(compute):
            cached = self.rows[i].residual
            # A skipping row has one (_forced computes otherwise)
            if not computed and cached is not None:
                out[i] = base[i] + cached
        if rows:
            with (
                self.narrow([self._batch_row(i) for i in rows])
                if self.narrow is not None
                else nullcontext()
            ):
                computed_rows = run_blocks(torch.tensor(rows, device=base.device))
            for j, i in enumerate(rows):
                self.rows[i].residual = computed_rows[j] - base[i]
                out[i] = computed_rows[j]
        return out

    # -- report
    # ----------------------------------------------------------------------------------

    def report(self, row: int) -> BranchCacheReport:
        """``{computed_steps, skipped_steps, trace}`` of one row: ``trace`` is ``[step,
        signal, decision]`` per step (1-based), ``signal`` the value compared with the
        threshold (``None`` without one). A row of threshold 0 reports as it would
        alone, uncached: every step computed, no signal."""
        state = self.rows[row]
        if state.threshold <= 0:
            return BranchCacheReport(
                computed_steps=state.total_steps,
                skipped_steps=0,
                trace=[[step + 1, None, COMPUTE] for step in range(state.total_steps)],
            )
        trace = state.trace
        skipped = sum(1 for _, _, decision in trace if decision == SKIP)
        return BranchCacheReport(
            computed_steps=len(trace) - skipped,
            skipped_steps=skipped,
            trace=[list(t) for t in trace],
        )
