"""Image edits on the native FLUX pipeline: img2img with ``strength`` and inpainting
with a mask, the way diffusers' ``FluxImg2ImgPipeline`` and ``FluxInpaintPipeline`` do
them, so images match on identical inputs.

- The input image is resized and normalised by diffusers' own ``VaeImageProcessor`` (and
  the mask by its
  binarising, grayscale one), then encoded by the VAE: a *sample* of the latent
  distribution, drawn from the image's own generator (seeded with its seed) before its
  noise is drawn from the same generator.
- ``strength`` s: of the N-step schedule, the first ``N - int(N * s)`` steps are
  skipped; the latents start
  as the image's latents noised to the first remaining step's sigma, ``sigma * noise +
  (1 - sigma) * x0``.
- With a mask (1 = repaint), after every step the known region is put back: the image's
  latents noised to
  the next step's sigma (the clean latents after the last step), ``latents = (1 - m) *
  known + m * latents``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from diffserve.models.flux.sampling import pack
from diffserve.types.request import GenerationRequest


def start_step(steps: int, strength: float | None) -> int:
    """The first schedule index an edit of ``strength`` runs (diffusers'
    ``get_timesteps``); admission filled an unset strength (``registry/edits.py``)."""
    if strength is None:
        raise ValueError(
            "an img2img or inpainting request reached the pipeline "
            "without a strength (not admitted)"
        )
    return int(max(steps - min(steps * strength, steps), 0))


@dataclass
class EditLatents:
    """Per row: the image's clean packed latents, the noise it started from and the
    packed mask (or None)."""

    image: Tensor
    noise: Tensor
    mask: Tensor | None


class EditPreparer:
    """Encodes a batch's input images (and masks) into starting latents, with diffusers'
    processors."""

    def __init__(
        self,
        vae: Any,
        latent_channels: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        from diffusers.image_processor import VaeImageProcessor

        self.vae, self.channels, self.dtype, self.device = (
            vae,
            latent_channels,
            dtype,
            device,
        )
        factor = 2 ** (len(vae.config.block_out_channels) - 1)
        self.images = VaeImageProcessor(
            vae_scale_factor=factor * 2, vae_latent_channels=latent_channels
        )
        self.masks = VaeImageProcessor(
            vae_scale_factor=factor * 2,
            vae_latent_channels=latent_channels,
            do_normalize=False,
            do_binarize=True,
            do_convert_grayscale=True,
        )

    @torch.inference_mode()
    def prepare(
        self, batch: Sequence[GenerationRequest], height: int, width: int, sigma: Tensor
    ) -> tuple[Tensor, EditLatents]:
        """Starting latents (packed) of every image of ``batch`` at ``sigma``, and what
        inpainting reuses."""
        from PIL import Image

        starts, images, noises, masks = [], [], [], []
        for request in batch:
            pixels = self.images.preprocess(
                Image.fromarray(request.images[0]), height=height, width=width
            )
            posterior = self.vae.encode(
                pixels.to(torch.float32).to(device=self.device, dtype=self.dtype)
            ).latent_dist
            mask = None
            if request.mask is not None:
                condition = self.masks.preprocess(
                    Image.fromarray(request.mask), height=height, width=width
                )
                size = (2 * (height // 16), 2 * (width // 16))
                mask = torch.nn.functional.interpolate(condition, size=size).to(
                    device=self.device, dtype=self.dtype
                )
                mask = pack(mask.repeat(1, self.channels, 1, 1))
            for seed in request.seeds:
                # One generator per image, consumed in diffusers' order: the VAE sample,
                # then the noise.
                generator = torch.Generator("cpu").manual_seed(seed)
                sample = torch.randn(
                    posterior.mean.shape,
                    generator=generator,
                    dtype=posterior.mean.dtype,
                )
                x0 = posterior.mean + posterior.std * sample.to(posterior.mean.device)
                x0 = (
                    x0 - self.vae.config.shift_factor
                ) * self.vae.config.scaling_factor
                noise = torch.randn(x0.shape, generator=generator, dtype=self.dtype).to(
                    self.device
                )
                s = sigma.to(device=self.device, dtype=x0.dtype)
                starts.append(pack(s * noise + (1.0 - s) * x0))
                images.append(pack(x0))
                noises.append(pack(noise))
                if mask is not None:
                    masks.append(mask)
        return torch.cat(starts), EditLatents(
            torch.cat(images), torch.cat(noises), torch.cat(masks) if masks else None
        )


class ReferencePreparer(EditPreparer):
    """FLUX.1 Kontext: the input image's latents (the distribution's mode, as diffusers
    encodes them) join the sequence as extra tokens whose position ids carry 1 in their
    first axis."""

    @torch.inference_mode()
    def reference(self, batch: Sequence[GenerationRequest]) -> tuple[Tensor, int, int]:
        """Packed reference latents, one row per image of ``batch``, and the reference's
        pixel size. The reference keeps its own size, rounded down to the model's
        multiple (no resize to Kontext's trained resolutions: the client chooses)."""
        from PIL import Image

        rows = []
        h, w = (d // 16 * 16 for d in batch[0].images[0].shape[:2])
        for request in batch:
            image = self.images.resize(Image.fromarray(request.images[0]), h, w)
            pixels = self.images.preprocess(image, h, w).to(
                device=self.device, dtype=self.dtype
            )
            x0 = self.vae.encode(pixels).latent_dist.mode()
            x0 = (x0 - self.vae.config.shift_factor) * self.vae.config.scaling_factor
            rows += [pack(x0)] * request.n
        return torch.cat(rows), h, w


def reimpose_known(
    latents: Tensor, edit: EditLatents, sigma: Tensor, last: list[bool]
) -> Tensor:
    """Inpainting: after a step, every row's unmasked region becomes its image noised to
    its next step's ``sigma`` (one per row), clean after its last step (``last``)."""
    if edit.mask is None:
        return latents
    sigma = sigma.to(latents.device).view(-1, 1, 1).to(latents.dtype)
    last_rows = torch.tensor(last, device=latents.device).view(-1, 1, 1)
    known = torch.where(
        last_rows, edit.image, sigma * edit.noise + (1.0 - sigma) * edit.image
    )
    return (1 - edit.mask) * known + edit.mask * latents
