"""``GenericPipeline``: any diffusers text-to-image DiT pipeline on diffserve's engine
and kernels.

diffusers' own pipeline class (named by ``model_index.json``) loads the directory
(safetensors only, offline) and runs the request; we move its denoiser onto our kernels
(``kernels.py``), compile its blocks when ``enforce_eager`` is false, and drive it from
``run``'s generator: the pipeline runs on its compute thread (``compute_thread.py``: one
thread for the load and every batch) that stops at every step's ``callback_on_step_end``
until the engine has seen the step, so step events, progress and abort at a step
boundary work as on the native path.

Seeds: image i gets its own ``torch.Generator`` seeded with ``seeds[i]`` (diffusers
draws each image's noise from its own generator), so its starting noise equals the
request run alone with that seed. A batch of one image is bit-identical to the same
request alone. With the stage's ``batch_invariant`` the denoiser's Linear and attention
calls run per sample, but diffusers' pipeline encodes the prompts and decodes the
latents of a larger batch together (and its denoiser's convolutions see the whole
batch), so the path does not claim batch invariance (``capabilities.batch_invariant``
false; see docs/models.md).
"""

from __future__ import annotations

import inspect
import queue
import threading
import time
import weakref
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import torch

from diffserve.config.schema import StageConfig
from diffserve.config.stage_sections import CacheConfig, VaeConfig
from diffserve.errors import ConfigError
from diffserve.layers.attestation import KernelCounters
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext, Pipeline, run_one
from diffserve.models.generic.build import load_generic
from diffserve.models.generic.call_args import call_arguments
from diffserve.models.generic.capabilities import generic_capabilities
from diffserve.models.generic.compute_thread import ComputeThread
from diffserve.models.generic.extras import PipelineExtras
from diffserve.models.generic.results import BatchRun, batch_results
from diffserve.models.generic.step_cache import GenericStepCache
from diffserve.models.generic.text_cache import CachedPromptEncoder
from diffserve.models.lora_adapters import LoraAdapters
from diffserve.models.memory import PhasePeaks
from diffserve.models.stepcache.policy import CacheSettings
from diffserve.models.vae_norm import running_sum_rms_norms
from diffserve.models.vae_tiling import configure_tiling, tiling
from diffserve.registry.models import ModelFamily
from diffserve.types.batching import batch_key, plan_of
from diffserve.types.memory import ComponentWeights
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, RequestResult, StepEvent

logger = get_logger(__name__)

__all__ = ["GenericPipeline"]


class _Cancelled(Exception):
    """Raised inside the pipeline's step callback when the engine closed the run."""


class GenericPipeline(Pipeline):
    """A diffusers pipeline whose denoiser runs on the stage's linear and attention
    backends."""

    def __init__(
        self,
        pipe: Any,
        family: ModelFamily,
        counters: KernelCounters,
        *,
        device: torch.device,
        dtype: torch.dtype,
        attention_roles: dict[str, str],
        compute: ComputeThread | None = None,
        vae_config: VaeConfig = VaeConfig(),
        cache: CacheConfig = CacheConfig(),
        step_cache: GenericStepCache | None = None,
        loras: LoraAdapters | None = None,
        text_cache: CachedPromptEncoder | None = None,
    ) -> None:
        self.pipe = pipe
        self.vae_config = vae_config
        # First-Block Cache where the stage asks and the family has one.
        self.cache, self.step_cache = (cache, step_cache)
        self.loras = loras  # per-request adapters where the family takes them
        configure_tiling(pipe.vae, vae_config)
        if device.type == "cpu":
            # The Qwen-Image VAE's RMS norms without F.normalize's slow CPU kernel
            # (vae_norm.py).
            running_sum_rms_norms(pipe.vae)
        # Where every batch runs (the thread that loaded the weights, see
        # compute_thread.py). It ends with this pipeline: a thread left behind would
        # keep its OpenMP team, slowing every later torch op of the process.
        self.compute = compute or ComputeThread("diffserve-generic-pipeline")
        weakref.finalize(self, self.compute.stop)
        self.family = family
        self.counters = counters
        self.device = device
        self.dtype = dtype
        # Module path -> role (what config explain cannot see)
        self.attention_roles = attention_roles
        # Set by from_stage (models/memory.py)
        self.weights: dict[str, ComponentWeights] = {}
        self._encode_ms = 0.0
        # The running batch's peak memory per phase (models/memory.py): diffusers' call
        # runs them all, so the phase changes at its encode_prompt and at every step
        # callback.
        self._peaks = PhasePeaks(device)
        encode_prompt = pipe.encode_prompt

        def timed_encode(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            self._peaks.stop()
            self._peaks.start("encode")
            try:
                return encode_prompt(*args, **kwargs)
            finally:
                self._encode_ms += (time.perf_counter() - start) * 1000.0
                self._peaks.stop()
                self._peaks.start("denoise")

        pipe.encode_prompt = timed_encode  # the "encode" phase of the timings
        # The step hook: ``callback_on_step_end`` where the pipeline has it, the older
        # per-step ``callback(step, timestep, latents)`` elsewhere (PixArt-Sigma), its
        # scheduler's step where it has neither (extras.py).
        self._call_params = frozenset(inspect.signature(type(pipe).__call__).parameters)
        self.extras = PipelineExtras(pipe, family, self._call_params, text_cache)
        self.capabilities = generic_capabilities(
            pipe,
            family,
            self._call_params,
            lora=loras is not None,
            cache=cache,
            step_cache=step_cache is not None,
        )

    @classmethod
    def from_stage(
        cls,
        model_dir: str | Path,
        stage: StageConfig,
        context: BuildContext = BuildContext(),
    ) -> GenericPipeline:
        """Load ``model_dir`` with diffusers (safetensors only, no hub), then move the
        denoiser's Linear and attention calls onto the stage's backends and compile its
        blocks unless ``enforce_eager``. All of it runs on the pipeline's compute
        thread, where its batches will run too."""
        root = Path(model_dir)
        if context.parallel.world_size > 1:
            raise ConfigError(
                "the generic path runs one rank per replica",
                path=f"stages.{stage.stage_id}.parallel",
                hint="set the parallel degrees to 1 (use num_replicas for "
                "more throughput)",
            )
        compute = ComputeThread("diffserve-generic-pipeline")
        try:
            return compute.call(lambda: cls._load(root, stage, context, compute))
        except BaseException:
            compute.stop()
            raise

    @classmethod
    def _load(
        cls,
        root: Path,
        stage: StageConfig,
        context: BuildContext,
        compute: ComputeThread,
    ) -> GenericPipeline:
        parts = load_generic(root, stage, context)
        pipeline = cls(
            parts.pipe,
            parts.family,
            parts.counters,
            device=parts.device,
            dtype=parts.dtype,
            attention_roles=parts.roles,
            compute=compute,
            vae_config=stage.vae,
            cache=stage.cache,
            step_cache=parts.step_cache,
            loras=parts.loras,
            text_cache=_text_cache(parts, root, stage),
        )
        pipeline.weights = parts.weights
        return pipeline

    @property
    def kernel_counters(self) -> KernelCounters:
        return self.counters

    @property
    def denoiser(self) -> Any:
        """diffusers' denoiser module, running on our kernels (what the attestation
        counts)."""
        return getattr(self.pipe, self.family.denoiser)

    def __call__(self, request: GenerationRequest) -> RequestResult:
        """Run one (seeded) request to completion."""
        return run_one(self, request)

    def run(
        self,
        batch: Sequence[GenerationRequest],
        joins: Callable[[], list[GenerationRequest]] | None = None,
    ) -> Generator[StepEvent | BatchResult, None, None]:
        """Yield a ``StepEvent`` per denoise step, then one ``BatchResult``. Close the
        generator to cancel (the pipeline stops at its next step callback). ``joins`` is
        unused: no step-level batching here."""
        # Admitted requests: defaults filled (engine/admission.py or run_one)
        batch = list(batch)
        if not batch:
            raise ValueError("run() needs at least one request")
        if len({batch_key(r) for r in batch}) != 1:
            raise ValueError("a batch must share one batch key")
        first = batch[0]
        steps = int(first.num_inference_steps or 0)
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        resume = threading.Semaphore(0)
        cancel = threading.Event()
        timings: dict[str, float] = {}

        def on_step(
            pipe: Any, index: int, timestep: Any, tensors: dict[str, Any]
        ) -> dict[str, Any]:
            timings["last_step"] = time.perf_counter()
            self._peaks.stop()
            self._peaks.start("denoise" if index + 1 < steps else "decode")
            if self.step_cache is not None:
                self.step_cache.next_step()
            events.put(("step", index + 1))
            # the engine has seen the step (and may have decided to stop)
            resume.acquire()
            if cancel.is_set():
                raise _Cancelled
            return {}

        def target() -> None:
            try:
                # The images are converted here too: no parallel torch op on the
                # caller's thread.
                run = self._call(batch, on_step, timings)
                events.put(("done", self._results(batch, run)))
            except BaseException as exc:  # noqa: BLE001 - handed to the generator, which re-raises it
                if self.step_cache is not None:
                    self.step_cache.abandon()
                events.put(("error", exc))

        job = self.compute.submit(target)
        try:
            while True:
                kind, value = events.get()
                if kind == "step":
                    yield StepEvent(step=value, total_steps=steps)
                    resume.release()
                elif kind == "done":
                    break
                else:
                    raise value
        finally:
            if not job.done():
                cancel.set()
                resume.release()
                job.result()
        yield BatchResult(value)

    def merge_rank_outputs(
        self, outputs: list[RequestResult], per_rank: list[list[dict[str, Any]]]
    ) -> None:
        """One rank per replica on this path: nothing to merge."""

    @torch.inference_mode()
    def _call(
        self,
        batch: list[GenerationRequest],
        on_step: Callable[..., dict[str, Any]],
        timings: dict[str, float],
    ) -> BatchRun:
        """The batch's images or videos (or latents), its audio, whether the VAE decoded
        in tiles, and the step cache's entries (one per image; None without a step
        cache)."""
        first, plan = batch[0], plan_of(batch[0])
        self._encode_ms = 0.0
        self._peaks = PhasePeaks(self.device)
        # The pipeline's own preparation counts as denoise, as in the timings.
        self._peaks.start("denoise")
        start = time.perf_counter()
        kwargs = call_arguments(
            self.pipe, self.family, self._call_params, batch, plan, self.device, on_step
        )
        if self.step_cache is not None:
            settings = CacheSettings.for_batch(self.cache, plan.cache_threshold)
            self.step_cache.start(settings, plan.steps, sum(r.n for r in batch))
        # The batch key gives every request of the batch the same adapters.
        if self.loras is not None:
            self.loras.activate(first.loras)
        try:
            with tiling(
                self.pipe.vae, self.vae_config, kwargs["height"], kwargs["width"]
            ) as tiled:
                outputs = self.extras.call(batch, kwargs, on_step)
        finally:
            if self.loras is not None:
                self.loras.deactivate()
        entries = self.step_cache.finish() if self.step_cache is not None else None
        end = time.perf_counter()
        self._peaks.stop()
        # Phases as the native path reports them; "denoise" includes the pipeline's own
        # preparation.
        last_step = timings.pop("last_step", end)
        timings.update(
            encode=self._encode_ms,
            denoise=(last_step - start) * 1000.0 - self._encode_ms,
            decode=(end - last_step) * 1000.0,
        )
        return BatchRun(
            images=outputs[0],
            # A model that makes sound returns (video, audio).
            audio=outputs[1] if len(outputs) > 1 else None,
            tiled=tiled,
            entries=entries,
            timings=dict(timings),
            peaks=dict(self._peaks.peaks),
        )

    def _results(
        self, batch: list[GenerationRequest], run: BatchRun
    ) -> list[RequestResult]:
        video = self.capabilities.video
        results = batch_results(
            batch,
            run,
            loras=self.loras,
            sample_rate=video.audio_sample_rate if video is not None else 0,
        )
        for request, result in zip(batch, results, strict=True):
            result.attestation.update(self.extras.attest(request))
        return results


def _text_cache(
    parts: Any, root: Path, stage: StageConfig
) -> CachedPromptEncoder | None:
    """The conditioning cache over the family's prompt encoder, where it names one."""
    method = parts.family.generic.prompt_encoder
    if method is None:
        return None
    return CachedPromptEncoder(
        parts.pipe,
        method,
        stage.conditioning_cache,
        root,
        str(parts.dtype),
        stage.text_encoder_quantization,
    )
