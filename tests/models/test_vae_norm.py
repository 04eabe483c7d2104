"""The Wan and Qwen-Image VAEs' RMS norm on CPU (models/vae_norm.py): diffusers' norm to
float32 rounding, the same bits whatever the thread count and the batch; on the Wan
decoder only (native path), on the whole Qwen-Image VAE (generic path)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from diffserve.models.vae_norm import channel_norm, running_sum_rms_norms

SHAPES = [((8, 16, 4, 64, 64), 1), ((2, 96, 3, 30, 52), 1), ((3, 40, 7), -1)]


@pytest.fixture
def threads() -> object:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(("shape", "dim"), SHAPES)
def test_the_norm_is_diffusers_to_rounding_and_the_same_for_any_threads_and_batch(
    shape: tuple[int, ...], dim: int, threads: object
) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3
    reference = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
    by_threads = []
    for count in (1, 2, 3):
        torch.set_num_threads(count)
        by_threads.append(channel_norm(x, dim))
    torch.testing.assert_close(by_threads[0], reference, rtol=2e-6, atol=0.0)
    assert all(torch.equal(norm, by_threads[0]) for norm in by_threads[1:])
    alone = [channel_norm(row.unsqueeze(0), dim) for row in x.unbind(0)]
    assert torch.equal(torch.cat(alone), by_threads[0])


def test_the_decoder_gets_it_and_decodes_within_rounding_of_diffusers(
    tiny_wan_dir: Path,
) -> None:
    from diffusers import AutoencoderKLWan
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    from diffserve.models.wan.video import WanVae

    theirs = AutoencoderKLWan.from_pretrained(
        tiny_wan_dir / "vae", torch_dtype=torch.float32
    ).eval()
    ours = WanVae(
        AutoencoderKLWan.from_pretrained(
            tiny_wan_dir / "vae", torch_dtype=torch.float32
        ).eval()
    ).vae
    norms = [m for m in ours.decoder.modules() if isinstance(m, WanRMS_norm)]
    assert norms and all("forward" in vars(m) for m in norms)
    assert not any(
        "forward" in vars(m)
        for m in ours.encoder.modules()
        if isinstance(m, WanRMS_norm)
    )
    assert running_sum_rms_norms(torch.nn.Linear(2, 2)) == 0
    latents = torch.randn(
        2, ours.config.z_dim, 3, 8, 8, generator=torch.Generator().manual_seed(1)
    )
    with torch.inference_mode():
        frames, reference = ours.decode(latents).sample, theirs.decode(latents).sample
    assert not torch.equal(frames, reference)  # another rounding, so the swap is in use
    # Frames in [-1, 1].
    psnr = 10 * torch.log10(4.0 / F.mse_loss(frames, reference)).item()
    assert psnr > 100, psnr


def test_the_generic_path_gives_qwen_image_vae_the_norm_on_cpu(
    tiny_qwen_image_dir: Path,
) -> None:
    """Qwen-Image's VAE, encoder and decoder, on the generic path: an edit's ~1 MP
    reference is encoded on every request (docs/models.md), so the encoder gets the norm
    too; a round trip stays within rounding of diffusers'."""
    from diffusers import AutoencoderKLQwenImage
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageRMS_norm
    from test_generic_pipeline import build

    ours = build(tiny_qwen_image_dir).pipe.vae
    norms = [m for m in ours.modules() if isinstance(m, QwenImageRMS_norm)]
    assert norms and all("forward" in vars(m) for m in norms)
    assert any(m in norms for m in ours.encoder.modules()) and any(
        m in norms for m in ours.decoder.modules()
    )
    theirs = AutoencoderKLQwenImage.from_pretrained(
        tiny_qwen_image_dir / "vae", torch_dtype=torch.float32
    ).eval()
    image = (
        torch.rand(1, 3, 1, 64, 96, generator=torch.Generator().manual_seed(2)) * 2 - 1
    )
    with torch.inference_mode():
        latents, reference = (
            ours.encode(image).latent_dist.mode(),
            theirs.encode(image).latent_dist.mode(),
        )
        decoded, expected = ours.decode(latents).sample, theirs.decode(reference).sample
    # Another rounding, so the swap is in use.
    assert not torch.equal(latents, reference)
    # Images in [-1, 1].
    psnr = 10 * torch.log10(4.0 / F.mse_loss(decoded, expected)).item()
    assert psnr > 100, psnr
