"""``NativeRunner``: the one serving loop of every native family.

A family subclasses it and writes model-shaped hooks only (``plan``, ``cfg_scale``,
``encode``, ``prepare``, ``sampler``, ``velocity``, ``after_step``, ``decode``,
``attest``; see ``models/runner/hooks.py``). The runner owns the rest, the same for
every family: the batch key check, the idle CFG rank, LoRA activation, the rows that
join at step boundaries and leave when done, one step cache per CFG branch, the CFG
combination (local or CFG-parallel), the Ulysses shard of the latent tokens, per-phase
memory peaks and timings, and the results with their attestation. ``run`` yields a
``StepEvent`` per step and a ``BatchResult`` whenever requests finish; closing the
generator cancels the batch.

A step-level batch holds requests of one ``step_key``; each brings its own schedule
(steps), its own cache slot (threshold) and its own adapters. Rows of one ``group_key``
(size, frames, edit inputs) share each transformer call; groups of other shapes run
back to back within the step (``groups.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor

from diffserve.config.stage_sections import CacheConfig
from diffserve.layers.attestation import KernelCounters
from diffserve.models.base import BuildContext, ParallelContext, Pipeline, run_one
from diffserve.models.lora_adapters import LoraAdapters
from diffserve.models.memory import PhasePeaks
from diffserve.models.runner.branches import BranchCaches, Guidance, idle
from diffserve.models.runner.groups import Group, by_group
from diffserve.models.runner.hooks import Decoded, Prepared, Schedule
from diffserve.models.runner.previews import take_previews
from diffserve.models.runner.results import finished_results
from diffserve.models.runner.rows import LiveRows
from diffserve.models.stepcache.policy import BranchCache, CacheSettings
from diffserve.models.stepcache.report import merge_negative_entries
from diffserve.registry.teacache import TeaCachePolynomial
from diffserve.types.batching import BatchPlan, StepKey, step_key
from diffserve.types.capabilities import PipelineCapabilities
from diffserve.types.memory import ComponentWeights
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, RequestResult, StepEvent

__all__ = ["NativeRunner"]

_R = TypeVar("_R", bound="NativeRunner")


class NativeRunner(Pipeline):
    """The shared loop; the attributes below are set by the family's constructor."""

    capabilities: PipelineCapabilities
    weights: dict[str, ComponentWeights]
    parallel: ParallelContext
    device: torch.device
    cache: CacheConfig
    teacache: TeaCachePolynomial | None = None
    loras: LoraAdapters | None = None
    # The latents' token axis (dim 1) is split across the Ulysses group by the runner
    # and gathered before decode. A family whose transformer shards inside (it sees
    # whole latents) leaves this False.
    shards_tokens: bool = False

    # -- the family's hooks
    # ---------------------------------------------------------------------------------
    @property
    def kernel_counters(self) -> KernelCounters:
        """The counters every Linear/Attention of the denoiser reports to (the
        attestation)."""
        raise NotImplementedError

    def plan(self, request: GenerationRequest) -> BatchPlan:
        """What every request of ``request``'s group shares (admitted: nothing is left
        unset). Its ``steps`` and ``cache_threshold`` are ``request``'s own: every
        request has its own schedule and cache slot."""
        raise NotImplementedError

    def cfg_scale(self, request: GenerationRequest) -> float | None:
        """The guidance scale of a batch that runs a negative branch; None runs one
        branch."""
        raise NotImplementedError

    def encode(
        self, requests: list[GenerationRequest], plan: BatchPlan, *, negative: bool
    ) -> Any:
        """One branch's text conditioning, one row per image (``n`` rows per
        request)."""
        raise NotImplementedError

    def prepare(self, requests: list[GenerationRequest], plan: BatchPlan) -> Prepared:
        """The joining requests' seeded latents (whole: the runner shards them) and
        per-row extras."""
        raise NotImplementedError

    def schedule(self, request: GenerationRequest, plan: BatchPlan) -> Schedule:
        """A fresh schedule for one request (its own steps, its own solver state)."""
        raise NotImplementedError

    def velocity(
        self, latents: Tensor, text: Any, rows: LiveRows, cache: BranchCache | None
    ) -> Tensor:
        """One branch's prediction for every row, each at its own step of its member's
        schedule (through ``cache`` when some row may skip)."""
        raise NotImplementedError

    def after_step(self, latents: Tensor, rows: LiveRows) -> Tensor:
        """The latents after a step, once the rows' step indices moved on (inpainting
        puts the known region back here). Default: unchanged."""
        return latents

    def decode(
        self, latents: Tensor, requests: list[GenerationRequest], plan: BatchPlan
    ) -> Decoded:
        """Finished rows (whole latents, on rank 0 only) to one output tensor per
        request."""
        raise NotImplementedError

    def attest(
        self, request: GenerationRequest, guided: bool, schedule: Schedule
    ) -> dict[str, Any]:
        """The family's own attestation entries of one finished request (text cache,
        experts, ...)."""
        return {}

    @classmethod
    def from_pretrained(
        cls: type[_R],
        model_dir: str | Path,
        *,
        device: str = "cpu",
        compile: bool = False,
        **stage_fields: Any,
    ) -> _R:
        """Library convenience for every native family: resolve ``stage_fields``
        (``dtype``, ``linear_backend``, ``attention_backend``... as in a deploy file, no
        environment) and build with ``from_stage``."""
        from diffserve.config.resolve import resolve

        stage_fields.setdefault("dtype", "float32")
        config = resolve(
            model=model_dir,
            overrides={**stage_fields, "enforce_eager": not compile},
            env={},
        )
        built = cls.from_stage(
            model_dir,
            config.stage_for_role("diffusion"),
            BuildContext(device=str(device)),
        )
        assert isinstance(built, cls)
        return built

    # -- the loop
    # ----------------------------------------------------------------------------------
    def __call__(self, request: GenerationRequest) -> RequestResult:
        """Run one (seeded) request to completion."""
        return run_one(self, request)

    def run(
        self,
        batch: Sequence[GenerationRequest],
        joins: Callable[[], list[GenerationRequest]] | None = None,
    ) -> Generator[StepEvent | BatchResult, None, None]:
        """Yield a ``StepEvent`` after every step and a ``BatchResult`` whenever
        requests finish. ``joins`` (step-level batching) is asked at every step boundary
        for requests of the same ``step_key``, which run from their own first step
        beside the others."""
        requests = list(batch)
        if not requests:
            raise ValueError("run() needs at least one request")
        key = _step_key(requests)
        first = requests[0]
        guidance = Guidance.of(self.cfg_scale(first), self.parallel)
        if self.parallel.cfg_rank != 0 and guidance.scale is None:
            # One branch: the cfg_rank 0 ranks run it.
            yield from idle(requests, self.plan(first).steps)
            return
        try:
            yield from self._denoise(requests, joins, key, guidance)
        finally:
            if self.loras is not None:
                self.loras.deactivate()

    def merge_rank_outputs(
        self, outputs: list[RequestResult], per_rank: list[list[dict[str, Any]]]
    ) -> None:
        """CFG-parallel: the negative branch's step-cache decisions, from its CFG rank,
        onto rank 0's entries."""
        merge_negative_entries(
            outputs, per_rank, self.parallel.cfg_size, self.parallel.ulysses_size
        )

    def _denoise(
        self,
        pending: list[GenerationRequest],
        joins: Callable[[], list[GenerationRequest]] | None,
        key: StepKey,
        guidance: Guidance,
    ) -> Generator[StepEvent | BatchResult, None, None]:
        groups: dict[Any, Group] = {}
        # The device's peak memory per phase (models/memory.py)
        peaks = PhasePeaks(self.device)
        while pending or groups:
            for shape, joining in by_group(pending).items():
                if shape not in groups:
                    groups[shape] = self._group(joining[0], guidance)
                self._join(groups[shape], joining, guidance, peaks)
            for group in groups.values():
                self._advance(group, guidance, peaks)
            previews = tuple(
                preview
                for group in groups.values()
                for preview in take_previews(self, group.live, group.plan)
            )
            yield StepEvent(
                step=max(s for g in groups.values() for s in g.live.steps),
                total_steps=max(
                    m.schedule.steps for g in groups.values() for m in g.live.members
                ),
                progress=tuple(p for g in groups.values() for p in g.live.progress()),
                previews=previews,
            )
            for shape, group in list(groups.items()):
                done = group.live.finished()
                if done:
                    yield BatchResult(
                        finished_results(
                            self, group.live, done, group.caches, group.plan, peaks
                        )
                    )
                    group.caches.keep_rows(group.live.drop(done))
                if not group.live.rows:
                    del groups[shape]
            asked = joins() if joins is not None and groups else []
            pending = [r for r in asked if _same_key(r, key)]

    def _group(self, first: GenerationRequest, guidance: Guidance) -> Group:
        """A new group for ``first``'s shape: its plan and its branches' caches."""
        plan = self.plan(first)
        settings = CacheSettings.for_batch(
            self.cache, plan.cache_threshold, self.teacache
        )
        branches = 2 if guidance.scale is not None and not guidance.split else 1
        caches = BranchCaches(
            settings,
            branches,
            self.parallel,
            self.kernel_counters,
            self.loras.state.narrow if self.loras is not None else None,
        )
        return Group(plan, LiveRows(), caches)

    def _join(
        self,
        group: Group,
        requests: list[GenerationRequest],
        guidance: Guidance,
        peaks: PhasePeaks,
    ) -> None:
        """Encode and prepare ``requests``' rows and add them to ``group``, each with
        its own schedule and cache slots."""
        start = time.perf_counter()
        peaks.start("encode")
        with torch.inference_mode():
            prepared = self._shard(self.prepare(requests, group.plan))
            texts = self._texts(requests, group.plan, guidance)
        schedules = [self.schedule(r, group.plan) for r in requests]
        group.live.add(
            requests, prepared, texts, (time.perf_counter() - start) * 1000.0, schedules
        )
        peaks.stop()
        for request, schedule in zip(requests, schedules, strict=True):
            threshold = request.cache_threshold
            group.caches.grow(
                request.n, 0.0 if threshold is None else threshold, schedule.steps
            )

    def _advance(self, group: Group, guidance: Guidance, peaks: PhasePeaks) -> None:
        """One step of every row of ``group``, each at its own step."""
        live = group.live
        assert live.latents is not None  # rows were added
        switched = [
            row
            for m in live.members
            if m.schedule.begin(live.step_of(m))
            for row in m.rows
        ]
        if switched:
            group.caches.forget(switched)
        if self.loras is not None:
            self.loras.activate_rows(
                [m.request.loras for m in live.members for _ in m.rows]
            )
        peaks.start("denoise")
        live.latents = self._step(live, group.caches, guidance)
        peaks.stop()
        live.steps = [i + 1 for i in live.steps]
        live.latents = self.after_step(live.latents, live)

    def _texts(
        self, requests: list[GenerationRequest], plan: BatchPlan, guidance: Guidance
    ) -> list[Any]:
        """The text conditioning of each branch this rank runs, in branch order."""
        # This rank's branch only: cfg_rank 1 runs the negative prompts.
        if guidance.split:
            return [self.encode(requests, plan, negative=self.parallel.cfg_rank == 1)]
        texts = [self.encode(requests, plan, negative=False)]
        if guidance.scale is not None:
            texts.append(self.encode(requests, plan, negative=True))
        return texts

    @torch.inference_mode()
    def _step(self, live: LiveRows, caches: BranchCaches, guidance: Guidance) -> Tensor:
        latents = live.latents
        assert latents is not None
        pred = self.velocity(latents, live.texts[0], live, caches[0])
        negative = (
            self.velocity(latents, live.texts[1], live, caches[1])
            if len(live.texts) > 1
            else None
        )
        pred = guidance.combine(pred, negative, self.parallel, self.kernel_counters)
        return live.per_member(
            lambda member, rows, step: member.schedule.step(
                latents[rows], pred[rows], step
            )
        )

    def _shard(self, prepared: Prepared) -> Prepared:
        """Every rank drew the full noise (same seeds); it keeps its token shard for the
        whole loop (the step is per token, so the shards only meet again in
        ``gather``)."""
        if self.shards_tokens and self.parallel.ulysses_size > 1:
            rank, degree = self.parallel.ulysses_rank, self.parallel.ulysses_size
            prepared.latents = prepared.latents.chunk(degree, dim=1)[rank].contiguous()
        return prepared

    @torch.inference_mode()
    def gather(self, latents: Tensor) -> Tensor:
        """The whole latents from the Ulysses shards (one all_gather per finished
        group), on every rank."""
        from diffserve.layers.collectives import all_gather_into

        if not self.shards_tokens or self.parallel.ulysses_size == 1:
            return latents
        shards = all_gather_into(
            latents, self.parallel.ulysses_group, self.kernel_counters
        )
        return torch.cat(shards.unbind(0), dim=1)


def _step_key(batch: list[GenerationRequest]) -> StepKey:
    keys = {step_key(r) for r in batch}
    if len(keys) != 1:
        # The scheduler batches by this key only; anything else is a caller bug.
        raise ValueError(
            "a step-level batch must share guidance, true CFG, text length, output "
            f"type and edit mode (one step key); got {sorted(keys)}"
        )
    return step_key(batch[0])


def _same_key(request: GenerationRequest, key: StepKey) -> bool:
    if step_key(request) != key:
        raise ValueError(
            f"request {request.request_id} joined a batch of another step key"
        )
    return True
