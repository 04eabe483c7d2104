"""Classifier-free guidance as the runner runs it: which branches this rank computes,
one step cache per branch (each decides alone), the combination (both branches here, or
one per rank of a CFG-parallel group exchanged once a step), and what an idle CFG rank
yields."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import Tensor

from diffserve.errors import ConfigError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.collectives import all_gather_into
from diffserve.models.base import ParallelContext
from diffserve.models.stepcache.policy import BranchCache, CacheSettings
from diffserve.models.stepcache.report import image_entries
from diffserve.types.attestation import CacheEntry
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, RequestResult, StepEvent


@dataclass(frozen=True)
class Guidance:
    """A batch's guidance on this rank: ``scale`` None runs one branch; ``split``
    (CFG-parallel) runs only this rank's branch (cfg_rank 0 the prompt's, 1 the negative
    prompt's) and gathers the other."""

    scale: float | None
    split: bool

    @classmethod
    def of(cls, scale: float | None, parallel: ParallelContext) -> Guidance:
        return cls(scale, scale is not None and parallel.cfg_size > 1)

    def combine(
        self,
        pred: Tensor,
        negative: Tensor | None,
        parallel: ParallelContext,
        counters: KernelCounters,
    ) -> Tensor:
        if self.scale is None:
            return pred
        if self.split:
            # One exchange per step; every rank combines the same two tensors in the
            # same order, so the latents stay identical on all ranks (and equal to the
            # single-rank result).
            pred, negative = all_gather_into(pred, parallel.cfg_group, counters).unbind(
                0
            )
        assert negative is not None
        return negative + self.scale * (pred - negative)


class BranchCaches:
    """One step cache per CFG branch this rank runs (none when the stage has no cache
    backend), one slot per row: each request joins with its own threshold and step
    count. A branch whose rows all have threshold 0 runs the plain forward."""

    def __init__(
        self,
        settings: CacheSettings,
        branches: int,
        parallel: ParallelContext,
        counters: KernelCounters,
        narrow: Callable[[list[int]], AbstractContextManager[None]] | None = None,
    ) -> None:
        """``narrow``: what a forward on some rows only must follow (the rows'
        adapters: ``LoraState.narrow``)."""
        self.settings = settings
        self.caches: list[BranchCache | None] = [
            BranchCache(settings, 0, group=parallel.ulysses_group, counters=counters)
            if settings.backend != "none"
            else None
            for _ in range(branches)
        ]
        for cache in self.caches:
            if cache is not None:
                cache.narrow = narrow

    def __getitem__(self, branch: int) -> BranchCache | None:
        """The branch's cache for this step; None when no row may skip."""
        cache = self.caches[branch]
        return cache if cache is not None and cache.active else None

    def grow(self, rows: int, threshold: float, total_steps: int) -> None:
        for cache in self.caches:
            if cache is not None:
                cache.add_rows(rows, threshold, total_steps)

    def forget(self, rows: list[int] | None = None) -> None:
        """Another denoiser takes over for ``rows`` (None: all): a residual of one must
        not stand in for the other's."""
        for cache in self.caches:
            if cache is not None:
                cache.forget(rows)

    def keep_rows(self, keep: list[int]) -> None:
        for cache in self.caches:
            if cache is not None:
                cache.keep_rows(keep)

    def entries(self, rows: list[int], steps: list[int]) -> list[CacheEntry]:
        """``attestation["cache"]`` of ``rows`` (``steps``: each row's step count): the
        negative branch's counts when this rank ran it too."""
        negative = self.caches[1] if len(self.caches) > 1 else None
        return image_entries(
            self.settings,
            steps,
            rows,
            self.caches[0],
            negative,
            cfg=len(self.caches) > 1,
        )


def idle(
    batch: list[GenerationRequest], steps: int
) -> Generator[StepEvent | BatchResult, None, None]:
    """A CFG rank of a batch with one branch: no forwards, no collectives, only step
    pace with the stop decision, then empty results (rank 0's are the answer)."""
    for i in range(steps):
        yield StepEvent(step=i + 1, total_steps=steps)
    yield BatchResult(
        [
            RequestResult(request_id=r.request_id, images=torch.empty(0), seeds=r.seeds)
            for r in batch
        ]
    )


def check_ulysses_heads(heads: int, parallel: ParallelContext, stage_id: int) -> None:
    """Ulysses splits the attention heads across its ranks: the degree must divide
    them."""
    degree = parallel.ulysses_size
    if degree > 1 and heads % degree:
        allowed = ", ".join(str(u) for u in range(1, heads + 1) if heads % u == 0)
        raise ConfigError(
            f"ulysses_degree {degree} must divide the transformer's "
            f"{heads} attention heads",
            path=f"stages.{stage_id}.parallel.ulysses_degree",
            hint=f"use one of {allowed}",
        )
