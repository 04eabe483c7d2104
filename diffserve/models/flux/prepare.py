"""FLUX's rows for requests joining a batch: seeded packed noise (or an edit's starting
latents at its first step's sigma), the distilled guidance of a guidance-embedded model,
a Kontext reference's tokens, and the rotary table of the batch key (this rank's rows of
it under Ulysses)."""

from __future__ import annotations

from typing import Protocol

import torch

from diffserve.layers.ulysses import image_shard
from diffserve.models.base import ParallelContext
from diffserve.models.flux import edits
from diffserve.models.flux.conditioning import FluxRows
from diffserve.models.flux.sampling import (
    EulerSchedule,
    get_noise,
    image_ids,
    pack,
    text_ids,
)
from diffserve.models.flux.transformer import FluxTransformer
from diffserve.models.runner import Prepared
from diffserve.types.batching import BatchPlan
from diffserve.types.request import GenerationRequest


class FluxModel(Protocol):
    """What the rows are made with (``FluxPipeline`` is one)."""

    transformer: FluxTransformer
    editor: edits.EditPreparer | edits.ReferencePreparer
    latent_channels: int
    parallel: ParallelContext
    device: torch.device
    dtype: torch.dtype

    def schedule(
        self, request: GenerationRequest, plan: BatchPlan
    ) -> EulerSchedule: ...


def prepare_rows(
    flux: FluxModel, requests: list[GenerationRequest], plan: BatchPlan
) -> Prepared:
    length, first = plan.text_length, requests[0]
    img_ids = image_ids(plan.height, plan.width, device=flux.device, dtype=flux.dtype)
    rows = FluxRows()
    if flux.transformer.params.guidance_embed:
        rows.guidance = torch.full(
            (sum(r.n for r in requests),),
            plan.guidance_scale,
            device=flux.device,
            dtype=torch.float32,
        )
    latents = pack(
        get_noise(
            [s for r in requests for s in r.seeds],
            flux.latent_channels,
            plan.height,
            plan.width,
            dtype=flux.dtype,
            device=flux.device,
        )
    )
    start = 0
    # Kontext: ids' first axis is 1.
    if first.images and isinstance(flux.editor, edits.ReferencePreparer):
        rows.ref, ref_h, ref_w = flux.editor.reference(requests)
        ref_ids = image_ids(ref_h, ref_w, device=flux.device, dtype=flux.dtype)
        ref_ids[:, 0] = 1
        img_ids = torch.cat([img_ids, ref_ids])
    # An edit: start from the input image noised to its first step's sigma.
    elif first.images:
        start = edits.start_step(plan.steps, first.strength)
        latents, rows.edit = flux.editor.prepare(
            requests, plan.height, plan.width, flux.schedule(first, plan).sigmas[start]
        )
    pe = flux.transformer.rope(
        text_ids(length, device=flux.device, dtype=flux.dtype), img_ids
    )
    # The rotary rows of this rank's image tokens (the runner shards them)
    if flux.parallel.ulysses_size > 1:
        pe = image_shard(
            pe, length, flux.parallel.ulysses_rank, flux.parallel.ulysses_size, dim=1
        )
    return Prepared(latents, rows, pe, start)
