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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Hashable, Sequence
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
from diffserve.models.runner.hooks import Decoded, Prepared, Sampler
from diffserve.models.runner.results import finished_results
from diffserve.models.runner.rows import LiveRows
from diffserve.models.stepcache.policy import BranchCache, CacheSettings
from diffserve.models.stepcache.report import merge_negative_entries
from diffserve.registry.teacache import TeaCachePolynomial
from diffserve.types.batching import BatchPlan, batch_key
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
        """What every request of the batch shares (admitted: nothing is left unset)."""
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

    def sampler(self, plan: BatchPlan) -> Sampler:
        """A fresh schedule for one batch."""
        raise NotImplementedError

    def velocity(
        self,
        latents: Tensor,
        text: Any,
        rows: LiveRows,
        sampler: Sampler,
        cache: BranchCache | None,
    ) -> Tensor:
        """One branch's prediction for every row (through ``cache`` when the batch runs
        one)."""
        raise NotImplementedError

    def after_step(self, latents: Tensor, rows: LiveRows, sampler: Sampler) -> Tensor:
        """The latents after a step, once the rows' step indices moved on (inpainting
        puts the known region back here). Default: unchanged."""
        return latents

    def decode(
        self, latents: Tensor, requests: list[GenerationRequest], plan: BatchPlan
    ) -> Decoded:
        """Finished rows (whole latents, on rank 0 only) to one output tensor per
        request."""
        raise NotImplementedError

    def attest(self, request: GenerationRequest, guided: bool) -> dict[str, Any]:
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
        requests finish. ``joins`` (step-level batching, when the sampler allows it) is
        asked at every step boundary for requests of the same batch key, which run from
        their own first step beside the others."""
        requests = list(batch)
        if not requests:
            raise ValueError("run() needs at least one request")
        key = _batch_key(requests)
        first = requests[0]
        plan = self.plan(first)
        guidance = Guidance.of(self.cfg_scale(first), self.parallel)
        if self.parallel.cfg_rank != 0 and guidance.scale is None:
            # One branch: the cfg_rank 0 ranks run it.
            yield from idle(requests, plan.steps)
            return
        # The batch key gives every request of the batch the same adapters.
        if self.loras is not None:
            self.loras.activate(first.loras)
        try:
            yield from self._denoise(requests, joins, key, plan, guidance)
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
        key: Hashable,
        plan: BatchPlan,
        guidance: Guidance,
    ) -> Generator[StepEvent | BatchResult, None, None]:
        live = LiveRows()
        # The device's peak memory per phase (models/memory.py)
        peaks = PhasePeaks(self.device)
        settings = CacheSettings.for_batch(
            self.cache, plan.cache_threshold, self.teacache
        )
        branches = 2 if guidance.scale is not None and not guidance.split else 1
        caches = BranchCaches(
            settings, plan.steps, branches, self.parallel, self.kernel_counters
        )
        sampler: Sampler | None = None
        while pending or live.rows:
            if pending:
                start = time.perf_counter()
                peaks.start("encode")
                with torch.inference_mode():
                    prepared, texts = (
                        self._shard(self.prepare(pending, plan)),
                        self._texts(pending, plan, guidance),
                    )
                live.add(
                    pending, prepared, texts, (time.perf_counter() - start) * 1000.0
                )
                peaks.stop()
                sampler = sampler or self.sampler(plan)
                caches.grow(sum(r.n for r in pending))
            assert live.latents is not None and sampler is not None  # rows were added
            if sampler.begin(live.steps):
                caches.forget()
            peaks.start("denoise")
            live.latents = self._step(live, sampler, caches, guidance)
            peaks.stop()
            live.steps = [i + 1 for i in live.steps]
            live.latents = self.after_step(live.latents, live, sampler)
            yield StepEvent(
                step=max(live.steps), total_steps=plan.steps, progress=live.progress()
            )
            done = live.finished(plan.steps)
            if done:
                yield BatchResult(
                    finished_results(self, live, done, caches, plan, peaks)
                )
                caches.keep_rows(live.drop(done))
            asked = (
                joins() if joins is not None and live.rows and sampler.joinable else []
            )
            pending = [r for r in asked if _same_key(r, key)]

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
    def _step(
        self, live: LiveRows, sampler: Sampler, caches: BranchCaches, guidance: Guidance
    ) -> Tensor:
        assert live.latents is not None
        pred = self.velocity(live.latents, live.texts[0], live, sampler, caches[0])
        negative = (
            self.velocity(live.latents, live.texts[1], live, sampler, caches[1])
            if len(live.texts) > 1
            else None
        )
        pred = guidance.combine(pred, negative, self.parallel, self.kernel_counters)
        return sampler.step(live.latents, pred, live.steps)

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


def _batch_key(batch: list[GenerationRequest]) -> Hashable:
    keys = {batch_key(r) for r in batch}
    if len(keys) != 1:
        # The scheduler batches by this key only; anything else is a caller bug.
        raise ValueError(
            "a batch must share height, width, steps and guidance_scale, "
            "true CFG, text length and "
            f"output type (one batch key); got {sorted(keys)}"
        )
    return batch_key(batch[0])


def _same_key(request: GenerationRequest, key: Hashable) -> bool:
    if batch_key(request) != key:
        raise ValueError(
            f"request {request.request_id} joined a batch of another batch key"
        )
    return True
