"""One generic batch's ``RequestResult`` per request: diffusers' ``"pt"`` output (images
``[B, C, H, W]``, videos ``[B, F, C, H, W]``, in [0, 1]; C is 4 where the model draws an
alpha channel) as uint8 channels-last for ``"pil"``, each request's rows, its step
cache and adapter entries, and the waveform of a model that makes sound."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from diffserve.models.lora_adapters import LoraAdapters
from diffserve.types.attestation import Attestation
from diffserve.types.request import GenerationRequest
from diffserve.types.results import RequestResult


@dataclass
class BatchRun:
    """What one call of diffusers' pipeline left: its images or videos, its audio
    (None: silent), whether the VAE decoded in tiles, the step cache's entries (one per
    image; None without a cache) and the per-phase timings and memory peaks."""

    images: torch.Tensor
    audio: torch.Tensor | None = None
    tiled: bool = False
    entries: list[Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)


def channels_last_uint8(images: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` or ``[B, F, C, H, W]`` floats in [0, 1] -> uint8 ``[B, H, W,
    C]`` or ``[B, F, H, W, C]``."""
    order = (0, 2, 3, 1) if images.ndim == 4 else (0, 1, 3, 4, 2)
    return (images.permute(*order).float() * 255).round().to(torch.uint8)


def _waveforms(audio: torch.Tensor) -> Any:
    """A vocoder's output as float32 numpy ``[B, channels, samples]``."""
    waves = audio.detach().float().cpu()
    if waves.ndim == 2:  # mono without a channel axis
        waves = waves[:, None]
    return waves.numpy()


def batch_results(
    batch: list[GenerationRequest],
    run: BatchRun,
    *,
    loras: LoraAdapters | None,
    sample_rate: int,
) -> list[RequestResult]:
    output_type = batch[0].output_type
    images = run.images
    if output_type == "pil":
        images = channels_last_uint8(images)
    elif output_type == "pt":
        images = images.float()
    counts = [r.n for r in batch]
    per_request = images.cpu().contiguous().split(counts)
    waves = _waveforms(run.audio) if run.audio is not None else None
    decoded = output_type != "latent"
    results, row = [], 0
    for request, imgs in zip(batch, per_request, strict=True):
        attestation = Attestation(vae_tiled=run.tiled) if decoded else Attestation()
        if run.entries is not None:
            attestation["cache"] = run.entries[row : row + request.n]
        if loras is not None and request.loras:
            attestation["lora"] = loras.describe(request.loras)
        result = RequestResult(
            request_id=request.request_id,
            images=imgs,
            seeds=request.seeds,
            timings_ms=dict(run.timings),
            memory_peak_mib=dict(run.peaks),
            attestation=attestation,
        )
        if waves is not None and decoded:
            result.audio = waves[row : row + request.n]
            result.audio_sample_rate = sample_rate
        row += request.n
        results.append(result)
    return results
