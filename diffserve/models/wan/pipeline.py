"""``WanVideoPipeline``: Wan2.1 / Wan2.2 text-to-video and Wan2.2 image-to-video as
hooks of the shared native runner (``models/runner``).

A batch runs as diffusers' ``WanPipeline`` / ``WanImageToVideoPipeline`` would run each
of its videos: UMT5 prompt states, seeded float32 noise per video, the model's own
scheduler (UniPC over flow sigmas), classifier-free guidance with the negative prompt
("" when unset) whenever ``guidance_scale > 1``, and, on Wan2.2, the high-noise expert
``transformer`` while ``t >= boundary_ratio * num_train_timesteps`` and the low-noise
``transformer_2`` after. Every request has its own schedule (``schedule.py``: its own
solver history and experts), so requests join a running batch at any step and each video
is the one it would be alone (``routing.py`` runs each expert on its rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from diffserve.config.schema import StageConfig
from diffserve.layers.attestation import KernelCounters
from diffserve.models.base import BuildContext, PipelineCapabilities
from diffserve.models.runner import Decoded, LiveRows, NativeRunner, Prepared, Schedule
from diffserve.models.stepcache.policy import BranchCache
from diffserve.models.wan.build import WanComponents, load_wan
from diffserve.models.wan.routing import routed_velocity
from diffserve.models.wan.schedule import WanSchedule
from diffserve.registry.edits import needs_image
from diffserve.registry.models import MODEL_FAMILIES
from diffserve.types.batching import BatchPlan, plan_of
from diffserve.types.capabilities import VideoCapabilities
from diffserve.types.request import GenerationRequest

__all__ = ["WanVideoPipeline"]


class WanVideoPipeline(NativeRunner):
    """Native Wan: a diffusers-format ``WanPipeline`` / ``WanImageToVideoPipeline``
    directory in, videos out."""

    def __init__(self, parts: WanComponents) -> None:
        self.experts, self.text, self.vae, self.scheduler_config = (
            parts.experts,
            parts.text,
            parts.vae,
            parts.scheduler_config,
        )
        self.device, self.dtype, self.parallel, self.weights = (
            parts.device,
            parts.dtype,
            parts.parallel,
            parts.weights,
        )
        # Registry data: Wan2.2 I2V.
        self.image_to_video = needs_image(MODEL_FAMILIES[parts.family].features.edits)
        self.cache, self.teacache = parts.stage.cache, parts.teacache
        params, spec, vae = self.experts.params, MODEL_FAMILIES[parts.family], self.vae
        self.capabilities = PipelineCapabilities(
            # Ulysses splits the tokens frame-major: a height of a multiple of 16 *
            # degree splits every frame evenly.
            family=parts.family,
            default_size=spec.defaults.height,
            size_multiple=vae.spatial
            * params.patch_size[1]
            * self.parallel.ulysses_size,
            max_sequence_length=spec.defaults.max_sequence_length,
            true_cfg=False,
            token_pixels=vae.spatial * params.patch_size[1],
            step_batching=self.parallel.world_size == 1,
            attention_roles=spec.attention_roles,
            edits=spec.features.edits,
            batch_invariant=parts.stage.batch_invariant,
            default_cache_threshold=self.cache.request_threshold,
            video=VideoCapabilities(
                temporal_factor=vae.temporal * params.patch_size[0],
                default_height=spec.defaults.height,
                default_width=spec.defaults.width,
                animates_image=self.image_to_video,
            ),
        )

    @classmethod
    def from_stage(
        cls,
        model_dir: str | Path,
        stage: StageConfig,
        context: BuildContext = BuildContext(),
    ) -> WanVideoPipeline:
        return cls(load_wan(Path(model_dir), stage, context))

    @property
    def kernel_counters(self) -> KernelCounters:
        return self.experts.counters

    # -- the runner's hooks
    # ----------------------------------------------------------------------------------
    def plan(self, request: GenerationRequest) -> BatchPlan:
        plan = plan_of(request)
        if plan.num_frames is None:
            raise ValueError(
                f"request {request.request_id} was not admitted (num_frames "
                "must be set)"
            )
        return plan

    def cfg_scale(self, request: GenerationRequest) -> float | None:
        guidance = request.guidance_scale
        return float(guidance) if guidance is not None and guidance > 1.0 else None

    def encode(
        self, requests: list[GenerationRequest], plan: BatchPlan, *, negative: bool
    ) -> Tensor:
        prompts = (
            [r.negative_prompt or "" for r in requests]
            if negative
            else [r.prompt for r in requests]
        )
        repeats = torch.tensor([r.n for r in requests], device=self.device)
        return self.text.encode(prompts, plan.text_length).repeat_interleave(
            repeats, dim=0
        )

    def prepare(self, requests: list[GenerationRequest], plan: BatchPlan) -> Prepared:
        assert plan.num_frames is not None  # plan() checked it
        frames, height, width = plan.num_frames, plan.height, plan.width
        latents = self.vae.noise(
            [s for r in requests for s in r.seeds], frames, height, width, self.device
        )
        first_frames = (
            torch.cat(
                [
                    self.vae.first_frame_condition(
                        r.images[0], frames, height, width, self.device
                    ).repeat(r.n, 1, 1, 1, 1)
                    for r in requests
                ]
            )
            if self.image_to_video
            else None
        )
        return Prepared(latents, first_frames, self.experts.rope(latents))

    def schedule(self, request: GenerationRequest, plan: BatchPlan) -> WanSchedule:
        steps = request.num_inference_steps
        assert steps is not None  # plan() checked it
        return WanSchedule(self.scheduler_config, steps, self.experts, self.device)

    def velocity(
        self, latents: Tensor, text: Tensor, rows: LiveRows, cache: BranchCache | None
    ) -> Tensor:
        model_input = (
            latents if rows.extras is None else torch.cat([latents, rows.extras], dim=1)
        )
        # Every row at its own step of its own request's schedule.
        timesteps = rows.per_row(lambda member, step: member.schedule.timestep(step))
        probe = self.teacache.probe if self.teacache is not None else None
        return routed_velocity(
            self.experts,
            model_input.to(self.dtype),
            timesteps,
            text,
            rows,
            cache,
            probe,
        )

    def decode(
        self, latents: Tensor, requests: list[GenerationRequest], plan: BatchPlan
    ) -> Decoded:
        output_type = requests[0].output_type
        videos = (
            latents
            if output_type == "latent"
            else self.vae.decode(latents, output_type)
        )
        return Decoded([part.cpu() for part in videos.split([r.n for r in requests])])

    def attest(
        self, request: GenerationRequest, guided: bool, schedule: Schedule
    ) -> dict[str, Any]:
        assert isinstance(schedule, WanSchedule)
        return {
            "experts": self.experts.report(
                schedule.ran, schedule.boundary_timestep, cfg=guided
            )
        }
