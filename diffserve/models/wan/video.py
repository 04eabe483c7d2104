"""Wan's latent video: seeded noise, the image-to-video condition (the first frame
encoded by the VAE beside a frame mask), and decoding latents back to frames, each as
diffusers' Wan pipelines compute it."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from diffserve.models.conv_layout import channels_last_convs
from diffserve.models.vae_norm import running_sum_rms_norms


class WanVae:
    """The Wan VAE (``AutoencoderKLWan``) with its latent statistics and frame
    processor."""

    def __init__(self, vae: Any) -> None:
        from diffusers.video_processor import VideoProcessor

        weight = next(vae.parameters())
        if weight.device.type == "cpu" and weight.dtype != torch.float32:
            channels_last_convs(vae)  # ~5x faster in bfloat16 (models/conv_layout.py)
        # About half a CPU decode (models/vae_norm.py); the encoder keeps.
        if weight.device.type == "cpu":
            # Diffusers' norm: an image-to-video condition is theirs bit for bit.
            running_sum_rms_norms(vae.decoder)
        self.vae = vae
        config = vae.config
        self.temporal = int(getattr(config, "scale_factor_temporal", 4) or 4)
        self.spatial = int(getattr(config, "scale_factor_spatial", 8) or 8)
        self.channels = int(config.z_dim)
        self.mean = torch.tensor(config.latents_mean).view(1, self.channels, 1, 1, 1)
        self.inv_std = 1.0 / torch.tensor(config.latents_std).view(
            1, self.channels, 1, 1, 1
        )
        self.processor = VideoProcessor(vae_scale_factor=self.spatial)

    def latent_shape(
        self, frames: int, height: int, width: int
    ) -> tuple[int, int, int, int]:
        return (
            self.channels,
            (frames - 1) // self.temporal + 1,
            height // self.spatial,
            width // self.spatial,
        )

    def noise(
        self,
        seeds: list[int],
        frames: int,
        height: int,
        width: int,
        device: torch.device,
    ) -> Tensor:
        """float32 ``[len(seeds), C, F', H', W']``: each video's noise from its own CPU
        generator (diffusers' ``randn_tensor`` with one generator per video), so a video
        is its seed's whatever its batch."""
        shape = self.latent_shape(frames, height, width)
        return torch.cat(
            [
                torch.randn(
                    (1, *shape),
                    generator=torch.Generator("cpu").manual_seed(seed),
                    dtype=torch.float32,
                )
                for seed in seeds
            ]
        ).to(device)

    @torch.inference_mode()
    def first_frame_condition(
        self,
        image: np.ndarray,
        frames: int,
        height: int,
        width: int,
        device: torch.device,
    ) -> Tensor:
        """float32 ``[1, 4 + C, F', H', W']``: the frame mask (1 on the first frame's
        latent steps) and the normalized latents of the first frame followed by black
        frames (Wan2.2 image-to-video)."""
        from PIL import Image

        vae_dtype = next(self.vae.parameters()).dtype
        pixels = self.processor.preprocess(
            Image.fromarray(image), height=height, width=width
        )
        pixels = pixels.to(device, dtype=torch.float32).unsqueeze(2)
        video = torch.cat(
            [pixels, pixels.new_zeros(1, pixels.shape[1], frames - 1, height, width)],
            dim=2,
        )
        latents = (
            self.vae.encode(video.to(dtype=vae_dtype))
            .latent_dist.mode()
            .to(torch.float32)
        )
        latents = (latents - self.mean.to(device)) * self.inv_std.to(device)
        _, latent_frames, latent_h, latent_w = self.latent_shape(frames, height, width)
        mask = torch.ones(1, 1, frames, latent_h, latent_w)
        mask[:, :, 1:] = 0
        mask = torch.cat(
            [mask[:, :, :1].repeat_interleave(self.temporal, dim=2), mask[:, :, 1:]],
            dim=2,
        )
        mask = (
            mask.view(1, -1, self.temporal, latent_h, latent_w)
            .transpose(1, 2)
            .to(device)
        )
        return torch.cat([mask, latents], dim=1)

    @torch.inference_mode()
    def decode(self, latents: Tensor, output_type: str) -> Tensor:
        """Videos from latents: uint8 ``[B, F, H, W, 3]`` ("pil"), or float32 in [0, 1]
        of that shape ("pt")."""
        vae_dtype = next(self.vae.parameters()).dtype
        device = latents.device
        latents = latents.to(vae_dtype) / self.inv_std.to(
            device, vae_dtype
        ) + self.mean.to(device, vae_dtype)
        frames = self.vae.decode(latents, return_dict=False)[0]
        videos = torch.from_numpy(
            self.processor.postprocess_video(frames, output_type="np")
        )
        if output_type == "pt":
            return videos.float()
        return (videos * 255).round().clamp(0, 255).to(torch.uint8)
