"""``WanVideoPipeline``: Wan2.1 / Wan2.2 text-to-video and Wan2.2 image-to-video on the native transformer.

One homogeneous batch (one ``types.batching.BatchKey``: size, frames, steps, guidance, first-frame size) runs
as diffusers' ``WanPipeline`` / ``WanImageToVideoPipeline`` would run each of its videos: UMT5 prompt states,
seeded float32 noise per video, the model's own scheduler (UniPC over flow sigmas), classifier-free guidance
with the negative prompt ("" when unset) whenever ``guidance_scale > 1``, and, on Wan2.2, the high-noise
expert ``transformer`` while ``t >= boundary_ratio * num_train_timesteps`` and the low-noise ``transformer_2``
after. Each step yields a ``StepEvent``; closing the generator cancels the batch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from diffserve.config.schema import CacheConfig, StageConfig
from diffserve.errors import ConfigError, ModelLoadError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.collectives import all_gather_into
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext, ParallelContext, Pipeline, PipelineCapabilities
from diffserve.models.loader import read_config
from diffserve.models.memory import PhasePeaks, component_weights
from diffserve.models.stage_kernels import stage_kernels
from diffserve.models.stepcache.policy import BranchCache, CacheSettings
from diffserve.models.stepcache.report import image_entries, merge_negative_entries
from diffserve.models.stepcache.teacache import stage_polynomial
from diffserve.models.wan.experts import Experts
from diffserve.models.wan.step_cache import cached_forward
from diffserve.models.wan.text import UMT5Text
from diffserve.models.wan.transformer import WanTransformer, load_wan_transformer
from diffserve.models.wan.video import WanVae
from diffserve.registry.models import MODEL_FAMILIES, denoiser_components, read_class_name
from diffserve.registry.teacache import TeaCachePolynomial, polynomial_for
from diffserve.types.attestation import Attestation
from diffserve.types.batching import batch_key
from diffserve.types.capabilities import VideoCapabilities
from diffserve.types.memory import ComponentWeights, describe_weights
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, RequestResult, StepEvent

logger = get_logger(__name__)

__all__ = ["WanVideoPipeline"]


class WanVideoPipeline(Pipeline):
    """Native Wan: a diffusers-format ``WanPipeline`` / ``WanImageToVideoPipeline`` directory in, videos out."""

    def __init__(self, experts: Experts, text: UMT5Text, vae: WanVae, scheduler_config: dict[str, Any], *,
                 family: str, device: torch.device, dtype: torch.dtype, image_to_video: bool,
                 parallel: ParallelContext = ParallelContext(), batch_invariant: bool = True,
                 cache: CacheConfig = CacheConfig(), teacache: TeaCachePolynomial | None = None) -> None:
        self.experts = experts
        self.text = text
        self.vae = vae
        self.scheduler_config = scheduler_config
        self.device, self.dtype = device, dtype
        self.parallel = parallel
        self.image_to_video = image_to_video
        self.cache, self.teacache = cache, teacache
        params = experts.params
        spec = MODEL_FAMILIES[family]
        self.capabilities = PipelineCapabilities(
            # Ulysses splits the tokens frame-major: a height of a multiple of 16 * degree splits every frame evenly.
            family=family, default_size=spec.default_height,
            size_multiple=vae.spatial * params.patch_size[1] * parallel.ulysses_size,
            max_sequence_length=spec.max_sequence_length, true_cfg=False, attention_roles=spec.attention_roles,
            edits=("first_frame",) if image_to_video else (), batch_invariant=batch_invariant,
            default_cache_threshold=float(cache.threshold or 0.0),
            video=VideoCapabilities(temporal_factor=vae.temporal * params.patch_size[0],
                                    default_height=spec.default_height, default_width=spec.default_width))
        self.weights: dict[str, ComponentWeights] = {}

    @classmethod
    def from_stage(cls, model_dir: str | Path, stage: StageConfig, context: BuildContext = BuildContext()) \
            -> WanVideoPipeline:
        from diffusers import AutoencoderKLWan

        from diffserve.models.loader import strict_from_pretrained

        root = Path(model_dir)
        family = read_class_name(root)
        refuse_unsupported(stage)
        index = json.loads((root / "model_index.json").read_text())
        names = denoiser_components(index)
        fit = polynomial_for(family, read_config(root / "transformer"), len(names))
        teacache = stage_polynomial(stage.cache, "wan", stage.stage_id, fit[0] if fit else None)
        start = time.perf_counter()
        device, dtype, kernels = stage_kernels(stage, context, MODEL_FAMILIES[family].attention_roles)
        transformers = {name: load_wan_transformer(root / name, kernels, dtype=dtype, device=device)
                        for name in names}
        parallel = context.parallel
        if parallel.ulysses_size > 1:
            heads = next(iter(transformers.values())).params.num_heads
            if heads % parallel.ulysses_size:
                allowed = ", ".join(str(u) for u in range(1, heads + 1) if heads % u == 0)
                raise ConfigError(f"ulysses_degree {parallel.ulysses_size} must divide the transformer's {heads} "
                                  "attention heads", path=f"stages.{stage.stage_id}.parallel.ulysses_degree",
                                  hint=f"use one of {allowed}")
            for transformer in transformers.values():
                transformer.shard_sequence(parallel.ulysses_group, parallel.ulysses_rank, parallel.ulysses_size)
        experts = Experts(transformers, index.get("boundary_ratio"))
        text = UMT5Text(root, dtype=dtype, device=device, per_prompt=stage.batch_invariant)
        try:
            vae = strict_from_pretrained(AutoencoderKLWan, root / "vae", dtype=dtype).to(device).eval()
            scheduler_config = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the VAE or scheduler of {root}: {exc}") from exc
        image_to_video = family == "WanImageToVideoPipeline"
        if image_to_video != (experts.params.in_channels > 16):
            raise ModelLoadError(f"{root}: a {family} whose transformer takes {experts.params.in_channels} channels "
                                 "(text-to-video takes 16, Wan2.2 image-to-video 36)")
        pipeline = cls(experts, text, WanVae(vae), scheduler_config, family=family, device=device, dtype=dtype,
                       image_to_video=image_to_video, parallel=context.parallel, batch_invariant=stage.batch_invariant,
                       cache=stage.cache, teacache=teacache)
        pipeline.weights = {**{name: component_weights(name, module) for name, module in transformers.items()},
                            "text_encoder": component_weights("text_encoder", text.encoder),
                            "vae": component_weights("vae", vae)}
        logger.info("loaded %s (%s on %s) in %.1fs; weights: %s", root, dtype, device, time.perf_counter() - start,
                    describe_weights(pipeline.weights))
        return pipeline

    @property
    def kernel_counters(self) -> KernelCounters:
        return self.experts.counters

    def merge_rank_outputs(self, outputs: list[RequestResult], per_rank: list[list[dict[str, Any]]]) -> None:
        """CFG-parallel: the negative branch's step-cache decisions, from its CFG rank, onto rank 0's entries."""
        merge_negative_entries(outputs, per_rank, self.parallel.cfg_size, self.parallel.ulysses_size)

    def run(self, batch: Sequence[GenerationRequest],
            joins: Callable[[], list[GenerationRequest]] | None = None) -> Generator[StepEvent | BatchResult, None, None]:
        requests = list(batch)
        if len({batch_key(r) for r in requests}) != 1:
            raise ValueError("a batch must share one batch key (size, frames, steps, guidance, ...)")
        first = requests[0]
        frames, height, width = first.num_frames, first.height, first.width
        steps, guidance, length = first.num_inference_steps, first.guidance_scale, first.max_sequence_length
        if frames is None or height is None or width is None or steps is None or guidance is None or length is None:
            raise ValueError(f"request {first.request_id} was not admitted (frames, size, steps, guidance and "
                             "max_sequence_length must be set)")
        cfg = guidance > 1.0
        split = cfg and self.parallel.cfg_size > 1  # CFG-parallel: this rank runs one branch
        if self.parallel.cfg_rank != 0 and not cfg:
            # One branch: the cfg_rank 0 ranks run it; this rank keeps step pace without forwards or collectives.
            for i in range(steps):
                yield StepEvent(step=i + 1, total_steps=steps)
            yield BatchResult([RequestResult(request_id=r.request_id, images=torch.empty(0), seeds=r.seeds)
                               for r in requests])
            return
        peaks = PhasePeaks(self.device)
        start = time.perf_counter()
        peaks.start("encode")
        repeats = torch.tensor([r.n for r in requests], device=self.device)
        negatives = [r.negative_prompt or "" for r in requests]
        if split and self.parallel.cfg_rank == 1:  # this rank's branch is the negative prompts'
            text, negative = self.text.encode(negatives, length).repeat_interleave(repeats, dim=0), None
        else:
            text = self.text.encode([r.prompt for r in requests], length).repeat_interleave(repeats, dim=0)
            negative = self.text.encode(negatives, length).repeat_interleave(repeats, dim=0) \
                if cfg and not split else None
        seeds = [s for r in requests for s in r.seeds]
        latents = self.vae.noise(seeds, frames, height, width, self.device)
        condition = self._first_frames(requests, frames, height, width) if self.image_to_video else None
        peaks.stop()
        encode_ms = (time.perf_counter() - start) * 1000.0
        scheduler = self._scheduler(steps)
        denoise_start = time.perf_counter()
        rope = self.experts.rope(latents)
        settings = CacheSettings.for_batch(self.cache, float(first.cache_threshold or 0.0), self.teacache)
        caches = self._branch_caches(settings, steps, latents.shape[0], negative is not None)
        peaks.start("denoise")
        for i, t in enumerate(scheduler.timesteps):
            expert, scale = self.experts.pick(t, scheduler.config.num_train_timesteps), guidance
            if self.experts.switched:  # a residual of one expert's blocks must not stand in for the other's
                for cache in caches:
                    if cache is not None:
                        cache.forget()
            model_input = latents if condition is None else torch.cat([latents, condition], dim=1)
            model_input = model_input.to(self.dtype)
            timestep = t.expand(latents.shape[0])
            pred = self._forward(expert, caches[0], i, model_input, timestep, text, rope)
            if split:  # one exchange per step; every rank combines the same two tensors in the same order
                pred, uncond = all_gather_into(pred, self.parallel.cfg_group, self.experts.counters.collectives) \
                    .unbind(0)
                pred = uncond + scale * (pred - uncond)
            elif negative is not None:
                uncond = self._forward(expert, caches[1], i, model_input, timestep, negative, rope)
                pred = uncond + scale * (pred - uncond)
            latents = scheduler.step(pred, t, latents, return_dict=False)[0]
            yield StepEvent(step=i + 1, total_steps=steps)
        peaks.stop()
        denoise_ms = (time.perf_counter() - denoise_start) * 1000.0
        decode_start = time.perf_counter()
        peaks.start("decode")
        # Every rank holds the same latents; only rank 0's result is returned, so only it decodes.
        if self.parallel.rank != 0:
            videos = torch.empty(len(seeds), 0)
        else:
            videos = latents if first.output_type == "latent" else self.vae.decode(latents, first.output_type)
        peaks.stop()
        timings = {"encode": encode_ms, "denoise": denoise_ms, "decode": (time.perf_counter() - decode_start) * 1000}
        entries = image_entries(settings, steps, list(range(len(seeds))), *caches, cfg=cfg)
        outputs, row = [], 0
        for request in requests:
            attestation = Attestation(cache=entries[row:row + request.n])
            attestation["experts"] = self.experts.report(cfg=cfg)
            outputs.append(RequestResult(request_id=request.request_id, images=videos[row:row + request.n].cpu(),
                                         seeds=request.seeds, timings_ms=dict(timings),
                                         memory_peak_mib=dict(peaks.peaks), attestation=attestation))
            row += request.n
        yield BatchResult(outputs)

    def _branch_caches(self, settings: CacheSettings, steps: int, rows: int,
                       negative: bool) -> tuple[BranchCache | None, BranchCache | None]:
        """One step cache per CFG branch this rank runs (each branch decides alone); none uncached."""
        if not settings.enabled:
            return None, None

        def branch() -> BranchCache:
            cache = BranchCache(settings, steps, group=self.parallel.ulysses_group, counters=self.experts.counters)
            cache.add_rows(rows)
            return cache

        return branch(), branch() if negative else None

    def _forward(self, expert: WanTransformer, cache: BranchCache | None, step: int, latents: Tensor,
                 timesteps: Tensor, text: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        if cache is None:
            return expert(latents, timesteps, text, rope)
        probe = self.teacache.probe if self.teacache is not None else None
        return cached_forward(expert, cache, [step] * latents.shape[0], latents, timesteps, text, rope, probe)

    def _scheduler(self, steps: int) -> Any:
        """A fresh scheduler of the model's own class and config for this batch (multistep schedulers keep
        per-run state), its timesteps set for ``steps``."""
        import diffusers

        config = dict(self.scheduler_config)
        scheduler = getattr(diffusers, str(config.get("_class_name", "UniPCMultistepScheduler"))).from_config(config)
        scheduler.set_timesteps(steps, device=self.device)
        scheduler.set_begin_index(0)
        self.experts.start(scheduler.timesteps, scheduler.config.num_train_timesteps)
        return scheduler

    def _first_frames(self, requests: list[GenerationRequest], frames: int, height: int, width: int) -> Tensor:
        rows = [self.vae.first_frame_condition(r.images[0], frames, height, width, self.device)
                .repeat(r.n, 1, 1, 1, 1) for r in requests]
        return torch.cat(rows)


# Stage keys the Wan pipeline does not run yet, with the value that does: refused at load, never ignored.
UNSUPPORTED = (("quantization", "none"), ("text_encoder_quantization", "none"), ("offload", "none"))


def refuse_unsupported(stage: StageConfig) -> None:
    for key, supported in UNSUPPORTED:
        value: Any = getattr(stage, key)
        if value != supported:
            raise ConfigError(f"{key}={value!r} is not supported on Wan yet", path=f"stages.{stage.stage_id}.{key}",
                              hint=f"set {key}: {supported} (quantization and offload run on FLUX)")
