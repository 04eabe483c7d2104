"""Latents -> the images a request asked for (``output_type``), one VAE decode per
image."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from diffserve.config.stage_sections import VaeConfig
from diffserve.models.flux.sampling import unpack
from diffserve.models.vae_tiling import tiling
from diffserve.types.request import GenerationRequest


@torch.inference_mode()
def decode_latents(
    vae: Any,
    batch: list[GenerationRequest],
    latents: Tensor,
    height: int,
    width: int,
    vae_config: VaeConfig = VaeConfig(),
) -> tuple[list[Tensor], bool]:
    """Per request: uint8 [n, H, W, 3] ("pil"), float [n, 3, H, W] in [0, 1] ("pt") or
    packed latents; and whether the VAE decoded in tiles (the stage's ``vae``
    section)."""
    per_request = list(latents.split([r.n for r in batch]))
    decode = [i for i, r in enumerate(batch) if r.output_type != "latent"]
    tiled = False
    if decode:
        x = unpack(torch.cat([per_request[i] for i in decode]), height, width)
        x = x / vae.config.scaling_factor + vae.config.shift_factor
        # One image at a time: batched convolutions differ in the last bit from single
        # ones, and image i of a request must equal the single-image request with its
        # seed.
        with tiling(vae, vae_config, height, width) as tiled:
            pixels = torch.cat(
                [vae.decode(z, return_dict=False)[0] for z in x.split(1)]
            )
        pixels = (pixels * 0.5 + 0.5).clamp(0, 1)
        decoded = pixels.split([batch[i].n for i in decode])
        for i, images in zip(decode, decoded, strict=True):
            if batch[i].output_type == "pt":
                per_request[i] = images.float()
            else:
                per_request[i] = (
                    (images.permute(0, 2, 3, 1).float() * 255).round().to(torch.uint8)
                )
    # Contiguous here, on the worker thread: a copy made by the engine thread would
    # start a second OpenMP team in this process, after which libgomp stops spinning and
    # every parallel region of the worker pays a wake-up (docs/engine.md, "One compute
    # thread per process").
    return [images.cpu().contiguous() for images in per_request], tiled
