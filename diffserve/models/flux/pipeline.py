"""``FluxPipeline``: FLUX.1 (and Kontext) as hooks of the shared native runner
(``models/runner``).

Encode (T5 + CLIP, through the conditioning cache or from the encoding stage's
payloads), prepare (seeded noise, an edit's starting latents or a Kontext reference, the
rotary table), one velocity call, Euler steps, decode (or hand the latents to the
decoding stage). Batches arrive admitted and seeded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from diffserve.config.schema import StageConfig
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.ulysses import image_shard
from diffserve.models.base import BuildContext, PipelineCapabilities
from diffserve.models.flux import edits
from diffserve.models.flux.build import FLUX_FIT, FluxComponents, load_flux
from diffserve.models.flux.conditioning import FluxRows, true_cfg
from diffserve.models.flux.connector_payloads import LatentsPayload
from diffserve.models.flux.decode import decode_latents
from diffserve.models.flux.sampling import (
    EulerSampler,
    get_noise,
    image_ids,
    pack,
    text_ids,
)
from diffserve.models.flux.step_cache import cached_velocity
from diffserve.models.runner import Decoded, LiveRows, NativeRunner, Prepared
from diffserve.models.stepcache.policy import BranchCache
from diffserve.models.stepcache.teacache import stage_polynomial
from diffserve.types.batching import BatchPlan, plan_of
from diffserve.types.request import GenerationRequest

__all__ = ["FluxPipeline"]


class FluxPipeline(NativeRunner):
    """Native FLUX.1 text-to-image: diffusers-format model directory in, images (and
    step events) out."""

    # Ulysses: each rank keeps its share of the image tokens for the whole loop
    shards_tokens = True

    def __init__(self, parts: FluxComponents) -> None:
        self.transformer, self.encoders, self.text, self.vae = (
            parts.transformer,
            parts.encoders,
            parts.text,
            parts.vae,
        )
        self.scheduler_config, self.vae_config = parts.scheduler_config, parts.stage.vae
        self.device, self.dtype, self.parallel, self.cache = (
            parts.device,
            parts.dtype,
            parts.parallel,
            parts.stage.cache,
        )
        self.loras, self.weights = parts.loras, parts.weights
        self.stage_id, self.decoded_elsewhere = (
            parts.stage.stage_id,
            parts.decoded_elsewhere,
        )
        self.teacache = stage_polynomial(self.cache, "flux", self.stage_id, FLUX_FIT)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)
        self.latent_channels = self.transformer.params.in_channels // 4
        family, parallel = parts.family, parts.parallel
        # What the family edits (registry): FLUX.1 from the image itself, FLUX.1 Kontext
        # from a reference image whose latents ride along as extra tokens.
        preparer = (
            edits.ReferencePreparer
            if "reference" in family.features.edits
            else edits.EditPreparer
        )
        self.editor = preparer(
            self.vae, self.latent_channels, dtype=self.dtype, device=self.device
        )
        self.capabilities = PipelineCapabilities(
            family=family.class_name,
            default_size=int(self.vae.config.sample_size),
            # Ulysses shards the image tokens ((H/16) * (W/16)) evenly: a side that is a
            # multiple of 16 * degree guarantees it, and admission then refuses any
            # other size before a rank sees it.
            size_multiple=2 * self.vae_scale_factor * parallel.ulysses_size,
            max_sequence_length=family.defaults.max_sequence_length,
            true_cfg=True,
            attention_roles=family.attention_roles,
            # Joins need every rank to agree on the step a request joins at: one rank
            # only, for now.
            step_batching=parallel.world_size == 1,
            lora=family.features.lora_check is not None,
            edits=family.features.edits if parallel.world_size == 1 else (),
            # Per-sample transformer calls and per-prompt encoding; the VAE decodes one
            # image at a time.
            batch_invariant=self.transformer.kernels.batch_invariant
            and (self.encoders is None or self.encoders.per_prompt),
            default_cache_threshold=self.cache.request_threshold,
        )

    @classmethod
    def from_stage(
        cls,
        model_dir: str | Path,
        stage: StageConfig,
        context: BuildContext = BuildContext(),
    ) -> FluxPipeline:
        """Load every component of ``model_dir`` (a component's weights from a single
        file when ``stage.components`` names it); the transformer's kernels are chosen
        here, once."""
        return cls(load_flux(Path(model_dir), stage, context))

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        compile: bool = False,
        **stage_fields: Any,
    ) -> FluxPipeline:
        """Library convenience: resolve ``stage_fields`` (``dtype``, ``linear_backend``,
        ``attention_backend``... as in a deploy file, no environment) and build with
        ``from_stage``."""
        from diffserve.config.resolve import resolve

        stage_fields.setdefault("dtype", "float32")
        config = resolve(
            model=model_dir,
            overrides={**stage_fields, "enforce_eager": not compile},
            env={},
        )
        return cls.from_stage(
            model_dir,
            config.stage_for_role("diffusion"),
            BuildContext(device=str(device)),
        )

    @property
    def kernel_counters(self) -> KernelCounters:
        return self.transformer.counters

    # -- the runner's hooks
    # ----------------------------------------------------------------------------------
    def plan(self, request: GenerationRequest) -> BatchPlan:
        return plan_of(request)

    def cfg_scale(self, request: GenerationRequest) -> float | None:
        return float(request.true_cfg_scale) if true_cfg(request) else None

    def encode(
        self, requests: list[GenerationRequest], plan: BatchPlan, *, negative: bool
    ) -> tuple[Tensor, Tensor]:
        txt, vec = (self.text.negative if negative else self.text.positive)(
            requests, plan.text_length
        )
        repeats = torch.tensor([r.n for r in requests], device=self.device)
        return txt.repeat_interleave(repeats, dim=0), vec.repeat_interleave(
            repeats, dim=0
        )

    def sampler(self, plan: BatchPlan) -> EulerSampler:
        tokens = image_ids(
            plan.height, plan.width, device="cpu", dtype=torch.float32
        ).shape[0]
        return EulerSampler(plan.steps, tokens, self.scheduler_config, self.device)

    @torch.inference_mode()
    def prepare(self, requests: list[GenerationRequest], plan: BatchPlan) -> Prepared:
        length, first = plan.text_length, requests[0]
        img_ids = image_ids(
            plan.height, plan.width, device=self.device, dtype=self.dtype
        )
        rows = FluxRows()
        if self.transformer.params.guidance_embed:
            rows.guidance = torch.full(
                (sum(r.n for r in requests),),
                plan.guidance_scale,
                device=self.device,
                dtype=torch.float32,
            )
        latents = pack(
            get_noise(
                [s for r in requests for s in r.seeds],
                self.latent_channels,
                plan.height,
                plan.width,
                dtype=self.dtype,
                device=self.device,
            )
        )
        start = 0
        # Kontext: ids' first axis is 1.
        if first.images and isinstance(self.editor, edits.ReferencePreparer):
            rows.ref, ref_h, ref_w = self.editor.reference(requests)
            ref_ids = image_ids(ref_h, ref_w, device=self.device, dtype=self.dtype)
            ref_ids[:, 0] = 1
            img_ids = torch.cat([img_ids, ref_ids])
        # An edit: start from the input image noised to its first step's sigma.
        elif first.images:
            start = edits.start_step(plan.steps, first.strength)
            latents, rows.edit = self.editor.prepare(
                requests, plan.height, plan.width, self.sampler(plan).sigmas[start]
            )
        pe = self.transformer.rope(
            text_ids(length, device=self.device, dtype=self.dtype), img_ids
        )
        # The rotary rows of this rank's image tokens (the runner shards them)
        if self.parallel.ulysses_size > 1:
            pe = image_shard(
                pe,
                length,
                self.parallel.ulysses_rank,
                self.parallel.ulysses_size,
                dim=1,
            )
        return Prepared(latents, rows, pe, start)

    def velocity(
        self,
        latents: Tensor,
        text: tuple[Tensor, Tensor],
        rows: LiveRows,
        sampler: Any,
        cache: BranchCache | None,
    ) -> Tensor:
        (txt, vec), extras = text, rows.extras
        t, tokens = sampler.model_timesteps(rows.steps, latents.dtype), latents.shape[1]
        # Kontext rides along.
        x = latents if extras.ref is None else torch.cat([latents, extras.ref], dim=1)
        if cache is None:
            return self.transformer(
                x, None, txt, None, t, vec, extras.guidance, pe=rows.shared
            )[:, :tokens]
        return cached_velocity(
            self.transformer,
            cache,
            rows.steps,
            x,
            txt,
            t,
            vec,
            extras.guidance,
            rows.shared,
        )[:, :tokens]

    def after_step(self, latents: Tensor, rows: LiveRows, sampler: Any) -> Tensor:
        edit = rows.extras.edit
        if edit is None or edit.mask is None:
            return latents
        # Inpainting: the known region back in, at the next sigma.
        return edits.reimpose_known(
            latents, edit, sampler.sigmas, rows.steps, len(sampler.timesteps)
        )

    def decode(
        self, latents: Tensor, requests: list[GenerationRequest], plan: BatchPlan
    ) -> Decoded:
        # the decoding stage of encode_denoise_decode takes them
        # (models/flux/connector_payloads.py)
        if self.decoded_elsewhere:
            outputs = [
                rows.cpu().contiguous()
                for rows in latents.split([r.n for r in requests])
            ]
            return Decoded(
                outputs,
                handoffs=[
                    LatentsPayload(
                        self.stage_id, "diffusion", rows, plan.height, plan.width
                    )
                    for rows in outputs
                ],
            )
        images, tiled = decode_latents(
            self.vae, requests, latents, plan.height, plan.width, self.vae_config
        )
        return Decoded(
            images, vae_tiled=tiled if requests[0].output_type != "latent" else None
        )

    def attest(self, request: GenerationRequest, guided: bool) -> dict[str, Any]:
        return dict(self.text.attest(request.request_id))
