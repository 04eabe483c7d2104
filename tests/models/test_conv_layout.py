"""Channels-last convolution weights (models/conv_layout.py): every Conv2d/Conv3d
converted, the outputs the same numbers, and the Wan VAE converted in bfloat16 only
(float32 keeps diffusers' layout and its bits)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from diffserve.models.conv_layout import channels_last_convs


def test_every_convolution_is_stored_channels_last_and_computes_the_same() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv3d(8, 16, 3, padding=1), nn.SiLU(), nn.Conv3d(16, 8, 1)
    ).to(torch.bfloat16)
    planar = nn.Conv2d(8, 8, 3, padding=1).to(torch.bfloat16)
    x = torch.randn(1, 8, 3, 12, 12).to(torch.bfloat16)
    y = torch.randn(1, 8, 12, 12).to(torch.bfloat16)
    with torch.inference_mode():
        before, before_planar = model(x), planar(y)
        assert channels_last_convs(model) == 2 and channels_last_convs(planar) == 1
        assert all(
            m.weight.is_contiguous(memory_format=torch.channels_last_3d)
            for m in model
            if isinstance(m, nn.Conv3d)
        )
        assert planar.weight.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(model(x), before, rtol=0.02, atol=0.02)
        torch.testing.assert_close(planar(y), before_planar, rtol=0.02, atol=0.02)


def test_the_wan_vae_is_converted_in_half_precision_only(tiny_wan_dir: Path) -> None:
    from diffusers import AutoencoderKLWan

    from diffserve.models.wan.video import WanVae

    for dtype, converted in ((torch.bfloat16, True), (torch.float32, False)):
        vae = WanVae(
            AutoencoderKLWan.from_pretrained(
                tiny_wan_dir / "vae", torch_dtype=dtype
            ).eval()
        ).vae
        convs = [m for m in vae.modules() if isinstance(m, nn.Conv3d)]
        assert convs and all(
            m.weight.is_contiguous(memory_format=torch.channels_last_3d) == converted
            for m in convs
            if m.kernel_size != (1, 1, 1)
        ), dtype
