"""``FluxPipeline``: encode prompts -> denoise (a generator of step events) -> decode, for one batch.

A batch is homogeneous (one ``types.batching.BatchKey``: the scheduler never forms another), and its
requests were validated and seeded at admission; this module trusts both and only re-checks the key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from diffserve.config.schema import CacheConfig, ConditioningCacheConfig, StageConfig, VaeConfig
from diffserve.errors import ModelLoadError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.ulysses import image_shard
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext, ParallelContext, Pipeline, PipelineCapabilities, run_one
from diffserve.models.flux import edits
from diffserve.models.flux.build import build_transformer
from diffserve.models.flux.cached_encoding import CachedTextEncoders
from diffserve.models.flux.conditioning import Conditioning, true_cfg
from diffserve.models.flux.decode import decode_latents
from diffserve.models.flux.denoise import Stepper
from diffserve.models.flux.encoders import TextEncoders
from diffserve.models.flux.live_batch import LiveBatch, Member
from diffserve.models.flux.lora import flux_lora_adapters
from diffserve.models.flux.sampling import (
    check_scheduler_config,
    get_noise,
    get_schedule,
    image_ids,
    pack,
    text_ids,
)
from diffserve.models.flux.stage_payloads import PayloadText
from diffserve.models.flux.transformer import FluxTransformer
from diffserve.models.lora_adapters import LoraAdapters
from diffserve.models.memory import PhasePeaks, component_weights
from diffserve.models.offload import offload_native
from diffserve.models.stepcache.policy import BranchCache, CacheSettings
from diffserve.models.stepcache.report import image_entries, merge_negative_entries
from diffserve.models.stepcache.teacache import stage_polynomial
from diffserve.models.vae_file import load_vae
from diffserve.models.vae_tiling import configure_tiling
from diffserve.registry.models import MODEL_FAMILIES, ModelFamily, read_class_name
from diffserve.types.attestation import Attestation
from diffserve.types.batching import BatchPlan, batch_key, plan_of
from diffserve.types.latents import LatentsPayload
from diffserve.types.memory import ComponentWeights, describe_weights
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, RequestResult, StepEvent

logger = get_logger(__name__)

__all__ = ["FluxPipeline"]

FAMILY = MODEL_FAMILIES["FluxPipeline"]


FLUX_FIT = "flux.1-dev"  # TeaCache's only FLUX polynomial (registry/teacache.py), for every FLUX checkpoint


class FluxPipeline(Pipeline):
    """Native FLUX.1 text-to-image: diffusers-format model directory in, images (and step events) out."""

    def __init__(self, transformer: FluxTransformer, encoders: TextEncoders | None, vae: Any,
                 scheduler_config: Mapping[str, Any], *, device: torch.device, dtype: torch.dtype,
                 parallel: ParallelContext = ParallelContext(), cache: CacheConfig = CacheConfig(),
                 family: ModelFamily = FAMILY, vae_config: VaeConfig = VaeConfig()) -> None:
        check_scheduler_config(scheduler_config)
        configure_tiling(vae, vae_config)
        self.vae_config = vae_config
        self.parallel = parallel
        self.cache = cache
        self.teacache = stage_polynomial(cache, "flux", 0, FLUX_FIT)
        self.transformer = transformer
        self.stepper = Stepper(transformer, parallel, device)
        self.encoders = encoders
        # Through the conditioning cache (off until from_stage configures it from the stage), or from the
        # payloads of the stage that encodes (no encoders here).
        self.text: CachedTextEncoders | PayloadText = (
            CachedTextEncoders(encoders, ConditioningCacheConfig(max_entries=0), "") if encoders is not None
            else PayloadText(transformer.params, stage_id=0, role="diffusion", device=device, dtype=dtype))
        self.vae = vae
        self.scheduler_config = dict(scheduler_config)
        self.device = device
        self.dtype = dtype
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1)
        self.latent_channels = transformer.params.in_channels // 4
        # What the family edits (registry): FLUX.1 from the image itself, FLUX.1 Kontext from a reference
        # image whose latents ride along as extra tokens.
        self.kontext = "reference" in family.edits
        self.capabilities = PipelineCapabilities(
            family=family.class_name, default_size=int(vae.config.sample_size),
            # Ulysses shards the image tokens ((H/16) * (W/16)) evenly: a side that is a multiple of
            # 16 * degree guarantees it, and admission then refuses any other size before a rank sees it.
            size_multiple=2 * self.vae_scale_factor * parallel.ulysses_size,
            max_sequence_length=family.max_sequence_length, true_cfg=True, attention_roles=family.attention_roles,
            # Joins need every rank to agree on the step a request joins at: one rank only, for now.
            step_batching=parallel.world_size == 1, lora=family.lora_check is not None,
            edits=family.edits if parallel.world_size == 1 else (),
            # Per-sample transformer calls and per-prompt encoding; the VAE decodes one image at a time.
            batch_invariant=transformer.kernels.batch_invariant and (encoders is None or encoders.per_prompt),
            default_cache_threshold=float(cache.threshold or 0.0))
        self.loras: LoraAdapters | None = None  # set by from_stage
        self.weights: dict[str, ComponentWeights] = {}  # set by from_stage (models/memory.py)
        self.stage_id, self.decoded_elsewhere = 0, False  # set by from_stage (staged topologies)
        self.editor: edits.EditPreparer | edits.ReferencePreparer = \
            (edits.ReferencePreparer if self.kontext else edits.EditPreparer)(vae, self.latent_channels, dtype=dtype,
                                                                            device=device)

    @classmethod
    def from_stage(cls, model_dir: str | Path, stage: StageConfig,
                   context: BuildContext = BuildContext()) -> FluxPipeline:
        """Load every component of ``model_dir`` (a component's weights from a single file when
        ``stage.components`` names it); the transformer's kernels are chosen here, once."""
        root = Path(model_dir)
        if not (root / "transformer").is_dir():
            raise ModelLoadError(f"{root} is not a FLUX model directory (no transformer/ folder)")
        stage_polynomial(stage.cache, "flux", stage.stage_id, FLUX_FIT)  # refused before anything loads
        start = time.perf_counter()
        transformer, quantized, device, dtype = build_transformer(root, stage, context)
        encoders = None if context.encoded_elsewhere else TextEncoders(
            root, dtype=dtype, device=device, per_prompt=stage.batch_invariant, weights_files=stage.components)
        encoders_quantized = encoders.quantize(stage.text_encoder_quantization) if encoders is not None else {}
        encoder_modules = encoders.modules() if encoders is not None else {}
        vae = load_vae(root / "vae", dtype=dtype, device=device, weights_file=stage.components.get("vae"))
        try:
            scheduler_config = json.loads((root / "scheduler" / "scheduler_config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read the scheduler config of {root}: {exc}") from exc
        logger.info("loaded %s (%s on %s) in %.1fs", root, dtype, device, time.perf_counter() - start)
        pipeline = cls(transformer, encoders, vae, scheduler_config, device=device, dtype=dtype,
                       parallel=context.parallel, cache=stage.cache, family=MODEL_FAMILIES[read_class_name(root)],
                       vae_config=stage.vae)
        pipeline.loras = transformer.lora_adapters = flux_lora_adapters(transformer, transformer.params, stage)
        pipeline.stage_id, pipeline.decoded_elsewhere = stage.stage_id, context.decoded_elsewhere
        pipeline.text = PayloadText(transformer.params, stage_id=stage.stage_id, role=stage.role, device=device,
                                    dtype=dtype) if encoders is None else CachedTextEncoders.for_model(
            encoders, root, stage.conditioning_cache, dict(stage.components), str(dtype),
            stage.text_encoder_quantization, stage.batch_invariant)
        offload_native(stage.offload, denoiser_blocks=[*transformer.double_blocks, *transformer.single_blocks],
                       components={**encoder_modules, "vae": vae}, device=device)
        pipeline.weights = {
            "transformer": component_weights("transformer", transformer, quantization=quantized.attested()),
            **{name: component_weights(name, module, quantization=encoders_quantized[name].attested())
               for name, module in encoder_modules.items()},
            "vae": component_weights("vae", vae)}
        logger.info("weights: %s", describe_weights(pipeline.weights))
        return pipeline

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, *, device: str = "cpu", compile: bool = False,
                        **stage_fields: Any) -> FluxPipeline:
        """Library convenience: resolve ``stage_fields`` (``dtype``, ``linear_backend``,
        ``attention_backend``... as in a deploy file, no environment) and build with ``from_stage``."""
        from diffserve.config.resolve import resolve

        stage_fields.setdefault("dtype", "float32")
        config = resolve(model=model_dir, overrides={**stage_fields, "enforce_eager": not compile}, env={})
        return cls.from_stage(model_dir, config.stage_for_role("diffusion"), BuildContext(device=str(device)))

    @property
    def kernel_counters(self) -> KernelCounters:
        return self.transformer.counters

    def __call__(self, request: GenerationRequest) -> RequestResult:
        """Run one (seeded) request to completion."""
        return run_one(self, request)

    def run(self, batch: Sequence[GenerationRequest],
            joins: Callable[[], list[GenerationRequest]] | None = None) -> Generator[StepEvent | BatchResult, None, None]:
        """Yield a ``StepEvent`` after every denoise step and a ``BatchResult`` whenever requests finish.
        ``joins`` (step-level batching) is asked at every step boundary for requests of the same batch key
        to add; they run from their own step 0 beside the others. Close the generator to cancel. The
        requests are admitted ones (defaults filled: ``engine/admission.py``, or ``run_one`` for a library
        call)."""
        batch = list(batch)
        if not batch:
            raise ValueError("run() needs at least one request")
        key = self._check_key(batch)
        first = batch[0]
        plan = plan_of(first, self.capabilities.default_size)
        steps = plan.steps
        if self.parallel.cfg_rank != 0 and not true_cfg(first):
            # A batch without true CFG has one branch: the cfg_rank 0 ranks run it, this rank idles
            # (no forwards, no collectives) and only keeps step pace with the stop decision.
            yield from self._idle(batch, steps)
            return

        if self.loras is not None:  # the batch key gives every request of the batch the same adapters
            self.loras.activate(first.loras)
        try:
            live = LiveBatch()
            peaks = PhasePeaks(self.device)  # the device's peak memory per phase (models/memory.py)
            settings = self._cache_settings(first)
            caches: tuple[BranchCache | None, BranchCache | None] = (None, None)
            sigmas = timesteps = None
            pending = batch
            while pending or live.rows:
                if pending:
                    start = time.perf_counter()
                    peaks.start("encode")
                    latents, cond, sigmas, timesteps = self._prepare(pending, plan)
                    peaks.stop()
                    live.add(pending, latents, cond, _ms_since(start), edits.start_step(steps, first.strength)
                             if first.images and not self.kontext else 0)
                    caches = self._branch_caches(settings, caches, sum(r.n for r in pending), steps, live.cond)
                assert live.latents is not None and sigmas is not None and timesteps is not None  # rows were added
                peaks.start("denoise")
                live.latents = self.stepper.step(live.latents, live.cond, sigmas, timesteps, live.steps,
                                                  plan.guidance_scale, caches)
                peaks.stop()
                live.steps = [i + 1 for i in live.steps]
                if live.cond.edit_mask is not None:  # inpainting: the known region back in, at the next sigma
                    c = live.cond
                    known = edits.EditLatents(c.edit_image, c.edit_noise, c.edit_mask)
                    live.latents = edits.reimpose_known(live.latents, known, sigmas, live.steps, steps)
                yield StepEvent(step=max(live.steps), total_steps=steps, progress=live.progress())
                done = live.finished(steps)
                if done:
                    yield BatchResult(self._finish(live, done, settings, caches, plan, peaks))
                pending = [r for r in (joins() if joins is not None and live.rows else []) if self._joinable(r, key)]
        finally:
            if self.loras is not None:
                self.loras.deactivate()

    def merge_rank_outputs(self, outputs: list[RequestResult], per_rank: list[list[dict[str, Any]]]) -> None:
        """CFG-parallel: the negative branch's step-cache decisions, from its CFG rank, onto rank 0's entries."""
        merge_negative_entries(outputs, per_rank, self.parallel.cfg_size, self.parallel.ulysses_size)

    def _check_key(self, batch: list[GenerationRequest]) -> Any:
        if len({batch_key(r) for r in batch}) != 1:
            # The scheduler batches by this key only; anything else is a caller bug.
            raise ValueError("a batch must share height, width, steps and guidance_scale, true CFG, text "
                             f"length and output type (one batch key); got {sorted(set(map(batch_key, batch)))}")
        return batch_key(batch[0])

    @staticmethod
    def _joinable(request: GenerationRequest, key: Any) -> bool:
        if batch_key(request) != key:
            raise ValueError(f"request {request.request_id} joined a batch of another batch key")
        return True

    def _finish(self, live: LiveBatch, done: list[Member], settings: CacheSettings,
                caches: tuple[BranchCache | None, BranchCache | None], plan: BatchPlan,
                peaks: PhasePeaks) -> list[RequestResult]:
        """Decode the requests that finished, report them, and drop their rows (and cache rows)."""
        rows = [row for member in done for row in member.rows]
        assert live.latents is not None
        latents = self.stepper.unshard(live.latents.index_select(0, torch.tensor(rows, device=live.latents.device)))
        start = time.perf_counter()
        requests = [m.request for m in done]
        peaks.start("decode")
        # Every rank holds the same latents; only rank 0's result is returned, so only it decodes (or hands
        # them to the decoding stage of encode_denoise_decode: types/latents.py).
        if self.decoded_elsewhere:
            images, tiled = [rows.cpu().contiguous() for rows in latents.split([r.n for r in requests])], False
        else:
            images, tiled = (decode_latents(self.vae, requests, latents, plan.height, plan.width, self.vae_config)
                             if self.parallel.rank == 0 else ([torch.empty(0) for _ in requests], False))
        decode_ms = _ms_since(start)
        peaks.stop()
        entries = image_entries(settings, plan.steps, rows, *caches,
                                cfg=live.cond.neg_txt is not None)
        results, offset = [], 0
        for member, image in zip(done, images, strict=True):
            n = member.request.n
            timings = {"encode": member.encode_ms, "denoise": (start - member.joined) * 1000.0,
                       "decode": decode_ms}
            attestation = Attestation(cache=entries[offset:offset + n])
            attestation.update(self.text.attest(member.request.request_id))
            if member.request.output_type != "latent" and not self.decoded_elsewhere:
                attestation["vae_tiled"] = tiled
            if self.loras is not None and member.request.loras:
                attestation["lora"] = self.loras.describe(member.request.loras)
            handoff = LatentsPayload(self.stage_id, "diffusion", image, plan.height, plan.width) \
                if self.decoded_elsewhere else None
            results.append(RequestResult(request_id=member.request.request_id, images=image,
                                         seeds=member.request.seeds, timings_ms=timings,
                                         memory_peak_mib=dict(peaks.peaks), attestation=attestation,
                                         handoff=handoff))
            offset += n
        keep = live.drop(done)
        for cache in caches:
            if cache is not None:
                cache.keep_rows(keep)
        return results

    def _cache_settings(self, request: GenerationRequest) -> CacheSettings:
        """The stage's cache rules with this batch's threshold: the request's, which admission filled with the
        stage's when it named none (unset: uncached)."""
        return CacheSettings.for_batch(self.cache, float(request.cache_threshold or 0.0), self.teacache)

    def _branch_caches(self, settings: CacheSettings, caches: tuple[BranchCache | None, BranchCache | None],
                       new_rows: int, steps: int,
                       cond: Conditioning) -> tuple[BranchCache | None, BranchCache | None]:
        """One cache per CFG branch this rank runs (each branch decides alone), grown by ``new_rows``
        joining rows; none when the batch runs uncached."""
        if not settings.enabled:
            return None, None

        def branch(cache: BranchCache | None) -> BranchCache:
            cache = cache or BranchCache(settings, steps, group=self.parallel.ulysses_group,
                                         counters=self.transformer.counters)
            cache.add_rows(new_rows)
            return cache

        return branch(caches[0]), branch(caches[1]) if cond.neg_txt is not None else None

    def _idle(self, batch: list[GenerationRequest],
              steps: int) -> Generator[StepEvent | BatchResult, None, None]:
        for i in range(steps):
            yield StepEvent(step=i + 1, total_steps=steps)
        yield BatchResult([RequestResult(request_id=r.request_id, images=torch.empty(0), seeds=r.seeds)
                           for r in batch])

    @torch.inference_mode()
    def _prepare(self, batch: list[GenerationRequest], plan: BatchPlan) -> tuple[Tensor, Conditioning, Tensor, Tensor]:
        height, width, length = plan.height, plan.width, plan.text_length
        img_ids = image_ids(height, width, device=self.device, dtype=self.dtype)
        sigmas, timesteps = get_schedule(plan.steps, img_ids.shape[0], self.scheduler_config)
        repeats = torch.tensor([r.n for r in batch], device=self.device)
        split = self.parallel.cfg_size > 1 and true_cfg(batch[0])
        if split and self.parallel.cfg_rank == 1:
            # This rank's branch is the negative one: it encodes only the negative prompts.
            txt, vec = self.text.negative(batch, length)
        else:
            txt, vec = self.text.positive(batch, length)
        noise = get_noise([s for r in batch for s in r.seeds], self.latent_channels, height, width,
                          dtype=self.dtype, device=self.device)
        cond = Conditioning(txt=txt.repeat_interleave(repeats, dim=0), vec=vec.repeat_interleave(repeats, dim=0),
                             pe=self.transformer.rope(text_ids(length, device=self.device, dtype=self.dtype),
                                                      img_ids))
        first = batch[0]
        if split:
            cond.cfg_split, cond.cfg_scale = True, float(first.true_cfg_scale)
        elif true_cfg(first):
            # True CFG: a second, negative-prompt forward per step (every request of the batch has one).
            neg_txt, neg_vec = self.text.negative(batch, length)
            cond.neg_txt = neg_txt.repeat_interleave(repeats, dim=0)
            cond.neg_vec = neg_vec.repeat_interleave(repeats, dim=0)
            cond.cfg_scale = float(first.true_cfg_scale)
        latents = pack(noise)
        if first.images and self.kontext:  # the reference's tokens, with 1 in their ids' first axis
            assert isinstance(self.editor, edits.ReferencePreparer)  # self.kontext chose it
            cond.ref, ref_h, ref_w = self.editor.reference(batch)
            ref_ids = image_ids(ref_h, ref_w, device=self.device, dtype=self.dtype)
            ref_ids[:, 0] = 1
            cond.pe = self.transformer.rope(text_ids(length, device=self.device, dtype=self.dtype),
                                            torch.cat([img_ids, ref_ids]))
        elif first.images:  # an edit: start from the input image noised to its first step's sigma
            start = edits.start_step(len(timesteps), first.strength)
            latents, edit = self.editor.prepare(batch, height, width, sigmas[start])
            cond.edit_image, cond.edit_noise, cond.edit_mask = edit.image, edit.noise, edit.mask
        if self.parallel.ulysses_size > 1:
            # Every rank draws the full noise (same seeds), then keeps its image shard for the whole loop:
            # the Euler step is per token, so the shards only meet again in Stepper.unshard.
            rank, degree = self.parallel.ulysses_rank, self.parallel.ulysses_size
            latents = latents.chunk(degree, dim=1)[rank].contiguous()
            cond.pe = image_shard(cond.pe, length, rank, degree, dim=1)
        return latents, cond, sigmas.to(self.device), timesteps.to(self.device)

def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0
