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
from diffserve.models.base import BuildContext
from diffserve.models.flux import edits
from diffserve.models.flux.build import (
    FLUX_FIT,
    FluxComponents,
    flux_capabilities,
    load_flux,
)
from diffserve.models.flux.conditioning import true_cfg
from diffserve.models.flux.connector_payloads import LatentsPayload
from diffserve.models.flux.decode import decode_latents
from diffserve.models.flux.prepare import prepare_rows
from diffserve.models.flux.sampling import EulerSchedule
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
        self.transformer, self.encoders = parts.transformer, parts.encoders
        self.text, self.vae, self.editor = parts.text, parts.vae, parts.editor
        self.scheduler_config, self.vae_config = parts.scheduler_config, parts.stage.vae
        self.device, self.dtype, self.parallel = (
            parts.device,
            parts.dtype,
            parts.parallel,
        )
        self.cache, self.loras, self.weights = (
            parts.stage.cache,
            parts.loras,
            parts.weights,
        )
        self.stage_id = parts.stage.stage_id
        self.decoded_elsewhere = parts.decoded_elsewhere
        self.teacache = stage_polynomial(self.cache, "flux", self.stage_id, FLUX_FIT)
        self.vae_scale_factor = parts.vae_scale_factor
        self.latent_channels = self.transformer.params.in_channels // 4
        self.capabilities = flux_capabilities(parts)

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

    def schedule(self, request: GenerationRequest, plan: BatchPlan) -> EulerSchedule:
        tokens = (plan.height // 16) * (plan.width // 16)  # image_ids' rows
        steps = request.num_inference_steps
        assert steps is not None  # admitted
        return EulerSchedule(steps, tokens, self.scheduler_config, self.device)

    @torch.inference_mode()
    def prepare(self, requests: list[GenerationRequest], plan: BatchPlan) -> Prepared:
        return prepare_rows(self, requests, plan)

    def velocity(
        self,
        latents: Tensor,
        text: tuple[Tensor, Tensor],
        rows: LiveRows,
        cache: BranchCache | None,
    ) -> Tensor:
        (txt, vec), extras, dtype = text, rows.extras, latents.dtype
        t = rows.per_row(
            lambda member, step: member.schedule.model_timestep(step, dtype)
        )
        tokens = latents.shape[1]
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

    def after_step(self, latents: Tensor, rows: LiveRows) -> Tensor:
        edit = rows.extras.edit
        if edit is None or edit.mask is None:
            return latents
        # Inpainting: the known region back in, at each row's next sigma.
        sigma = rows.per_row(lambda member, step: member.schedule.sigmas[step])
        last = [
            rows.steps[row] >= member.schedule.steps
            for member in rows.members
            for row in member.rows
        ]
        return edits.reimpose_known(latents, edit, sigma, last)

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

    def attest(
        self, request: GenerationRequest, guided: bool, schedule: Any
    ) -> dict[str, Any]:
        attested = dict(self.text.attest(request.request_id))
        ops = self.transformer.traced_ops()
        if ops:  # compiled: the kernel operators its blocks' graphs captured
            attested["compiled_ops"] = ops
        return attested
