"""Partial images (``GenerationRequest.partial_images``): a request's running latents
decoded at evenly spaced steps while it denoises, for the images API's streamed
``partial_image`` events. A preview reads the latents and never writes them, and draws
no random numbers, so the final image is the same bit for bit with or without them."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from diffserve.layers.attestation import KernelCounters
from diffserve.models.base import ParallelContext
from diffserve.models.runner.hooks import Decoded
from diffserve.models.runner.rows import LiveRows
from diffserve.types.batching import BatchPlan
from diffserve.types.request import GenerationRequest
from diffserve.types.results import Preview


class Previewing(Protocol):
    """What previews need of the runner (``NativeRunner`` is one)."""

    parallel: ParallelContext

    @property
    def kernel_counters(self) -> KernelCounters: ...
    def gather(self, latents: Tensor) -> Tensor: ...
    def decode(
        self, latents: Tensor, requests: list[GenerationRequest], plan: BatchPlan
    ) -> Decoded: ...


def preview_steps(start: int, total: int, count: int) -> tuple[int, ...]:
    """The steps done (``start`` < step < ``total``) after which a request that runs
    steps ``start``..``total`` shows its ``count`` partial images, evenly spaced; fewer
    when it has fewer steps between its first and its last (the last step's image is the
    result itself)."""
    run = total - start
    steps = (start + run * (i + 1) // (count + 1) for i in range(count))
    return tuple(dict.fromkeys(s for s in steps if start < s < total))


def take_previews(
    runner: Previewing, live: LiveRows, plan: BatchPlan
) -> tuple[Preview, ...]:
    """The partial images due after the step ``live`` just ran: every member whose
    steps done is one of its preview steps, its rows decoded (rank 0; every rank takes
    part in the gather of Ulysses shards). Kernel counters pause: a preview is not the
    request's output, and the attestation of its image stays what the image took."""
    due = []
    for member in live.members:
        count = member.request.partial_images
        if not count or member.request.output_type != "pil":
            continue
        steps = preview_steps(member.start_step, member.schedule.steps, count)
        done = live.step_of(member)
        if done in steps:
            due.append((member, steps.index(done)))
    if not due:
        return ()
    assert live.latents is not None
    previews = []
    with torch.inference_mode(), runner.kernel_counters.paused():
        for member, index in due:
            rows = torch.arange(
                member.first_row,
                member.first_row + member.request.n,
                device=live.latents.device,
            )
            latents = runner.gather(live.latents.index_select(0, rows))
            if runner.parallel.rank != 0:
                continue
            decoded = runner.decode(latents, [member.request], plan)
            if decoded.handoffs:  # a decoding stage holds the VAE: nothing to show
                continue
            previews.append(
                Preview(member.request.request_id, index, decoded.outputs[0].cpu())
            )
    return tuple(previews)
