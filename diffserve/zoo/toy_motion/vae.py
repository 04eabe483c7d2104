"""toy-motion's VAE: Wan's layout (causal 3D convolutions, 8x spatial and 4x temporal
compression, 16 channels), trained in two stages because a causal VAE trained from
scratch on CPU-sized clips collapses to grey.

1. A **per-frame** VAE: no temporal compression and every causal convolution's taps on
   earlier frames zero, so
   it is an image VAE; it trains on single frames through a one-tap twin of its
   convolutions (3x less work).
2. **Inflated** to 4x temporal compression: the same weights in a VAE with
   ``temperal_downsample`` [False, True,
   True], every ``time_conv`` set to pass the current frame through (the upsampling one
   copies it to both of its output frames), so it starts as the per-frame VAE applied to
   every fourth frame; then it trains on whole 17-frame clips (32x32 crops) and learns
   to use the frames between.

Why the temporal compression: with none, the object moves ~1.5 px (0.1 of a 16 px
transformer token) from one latent frame to the next, a change inside one token's
content the transformer has to tie to one prompt word; it never did (four directions
drew the same track). At 4x a latent frame moves 4x as far and the direction word took.
The causal VAE's first latent frame encodes the clip's first frame alone: an image
latent (``encode_clips``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Wan's VAE layout (8x spatial compression, 16 channels) at 16-64 channels (toy-shapes'
# widths; at 8-32 the checker read the shape from 81% of the per-frame VAE's
# reconstructions of held-out clips, at 16-64 94%). The per-frame stage: no temporal
# compression. The served one: Wan's own 4x, a 17x64x64 clip is 16 x 5 x 8 x 8 latents,
# 80 transformer tokens.
VAE_CONFIG: dict[str, Any] = {
    "base_dim": 16,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 1,
    "temperal_downsample": [False, False, False],
    "scale_factor_temporal": 1,
}
TEMPORAL_VAE_CONFIG: dict[str, Any] = {
    **VAE_CONFIG,
    "temperal_downsample": [False, True, True],
    "scale_factor_temporal": 4,
}


def as_input(batch: Any) -> Any:
    """uint8 pixels as the VAE's [-1, 1] floats."""
    return batch.float() / 127.5 - 1.0


def _causal_convs(vae: Any) -> list[Any]:
    """The VAE's causal convolutions that look at earlier frames (temporal kernel above
    1)."""
    return [
        m
        for m in vae.modules()
        if type(m).__name__ == "WanCausalConv3d" and m.weight.shape[2] > 1
    ]


def zero_earlier_frame_taps(vae: Any) -> None:
    """Zero every causal convolution's taps on earlier frames: each output frame then
    depends on its own input frame only (the causal padding puts the current frame on
    the last tap)."""
    import torch

    with torch.no_grad():
        for conv in _causal_convs(vae):
            conv.weight[:, :, :-1].zero_()


@contextmanager
def per_frame_twin(vae: Any) -> Iterator[None]:
    """Within: each causal convolution keeps only its current-frame tap and pads no
    earlier frames, so single frames (``[N, C, 1, H, W]``) train and encode at a third
    of the work. Outside again: the full taps, the earlier ones zero and the current one
    as trained. Build an optimizer inside, on the twin's parameters."""
    import torch

    convs = _causal_convs(vae)
    saved = [(conv.weight, conv._padding) for conv in convs]
    for conv in convs:
        conv.weight = torch.nn.Parameter(conv.weight.detach()[:, :, -1:].clone())
        conv._padding = (*conv._padding[:4], 0, 0)
    try:
        yield
    finally:
        with torch.no_grad():
            for conv, (weight, padding) in zip(convs, saved, strict=True):
                weight.zero_()
                weight[:, :, -1:].copy_(conv.weight)
                conv.weight, conv._padding = weight, padding


def inflate_to_temporal(per_frame: Any) -> Any:
    """A 4x temporally compressing VAE holding ``per_frame``'s weights (every tensor of
    the same shape: all but the ``time_conv``s), its ``time_conv``s passing the current
    frame through: on a still clip it encodes and decodes each frame exactly as
    ``per_frame`` does."""
    import torch
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan(**TEMPORAL_VAE_CONFIG)
    own = vae.state_dict()
    shared = {
        k: v
        for k, v in per_frame.state_dict().items()
        if k in own and own[k].shape == v.shape
    }
    vae.load_state_dict(shared, strict=False)
    with torch.no_grad():
        for name, conv in vae.named_modules():
            if not name.endswith("time_conv"):
                continue
            conv.weight.zero_()
            conv.bias.zero_()
            channels = conv.weight.shape[1]
            # Kernel (3, 1, 1): the current frame is the last tap.
            for c in range(channels):
                conv.weight[c, c, -1] = 1.0
                # Upsampling: both output frames copy it.
                if conv.weight.shape[0] == 2 * channels:
                    conv.weight[channels + c, c, -1] = 1.0
    return vae


def _frames_of(clips: Any) -> Any:
    """uint8 [N, 3, F, H, W] clips as [N * F, 3, 1, H, W] single frames."""
    count, channels, frames, height, width = clips.shape
    return clips.permute(0, 2, 1, 3, 4).reshape(
        count * frames, channels, 1, height, width
    )


def _crops(videos: Any, batch: int, crop: int, gen: Any) -> Any:
    """``batch`` random videos of ``videos`` ([N, 3, F, H, W]), cropped to ``crop`` x
    ``crop`` at a random place."""
    import torch

    picks = torch.randint(len(videos), (batch,), generator=gen).tolist()
    ys = torch.randint(videos.shape[3] - crop + 1, (batch,), generator=gen).tolist()
    xs = torch.randint(videos.shape[4] - crop + 1, (batch,), generator=gen).tolist()
    return torch.stack(
        [
            videos[i, :, :, y : y + crop, x : x + crop]
            for i, y, x in zip(picks, ys, xs, strict=True)
        ]
    )


def _fit(
    vae: Any,
    batches: Iterator[Any],
    steps: int,
    lr: float,
    kl_weight: float,
    gen: Any,
    desc: str,
) -> list[float]:
    """``steps`` AdamW steps (one-cycle, 5% warm-up) of reconstruction MSE +
    ``kl_weight`` KL."""
    import torch
    from tqdm.auto import tqdm

    optimizer = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, lr, total_steps=max(steps, 1), pct_start=0.05
    )
    losses: list[float] = []
    vae.train()
    for _ in tqdm(range(steps), desc=desc, mininterval=2.0):
        x = as_input(next(batches))
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample(generator=gen)).sample
        loss = (
            torch.nn.functional.mse_loss(recon, x) + kl_weight * posterior.kl().mean()
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def train_per_frame_vae(
    vae: Any,
    clips: Any,
    *,
    crop_steps: int,
    full_steps: int,
    batch: int,
    lr: float,
    kl_weight: float,
    gen: Any,
) -> list[float]:
    """Stage 1 (within ``per_frame_twin``): single frames, ``crop_steps`` on 32x32 crops
    then ``full_steps`` on whole frames (half the batch); one learning-rate cycle over
    both."""
    frames = _frames_of(clips)
    size = clips.shape[-1]

    def batches() -> Iterator[Any]:
        for step in range(crop_steps + full_steps):
            full = step >= crop_steps
            yield _crops(
                frames, batch // 2 if full else batch, size if full else size // 2, gen
            )

    return _fit(
        vae, batches(), crop_steps + full_steps, lr, kl_weight, gen, "vae (frames)"
    )


def train_temporal_vae(
    vae: Any,
    clips: Any,
    *,
    steps: int,
    batch: int,
    lr: float,
    kl_weight: float,
    gen: Any,
) -> list[float]:
    """Stage 2, on the inflated VAE: whole clips, 32x32 crops (measured at 16-64
    channels: 800 steps of 4 at lr 3e-4, 765 s on two cores; held-out whole-clip MSE
    0.0041 per frame after stage 1, 0.0053-0.0072 after it, and the checker's shape rate
    on the reconstructions 94% -> 91%: stage 2 keeps what stage 1 learned)."""
    size = clips.shape[-1]

    def batches() -> Iterator[Any]:
        while True:
            yield _crops(clips, batch, size // 2, gen)

    return _fit(vae, batches(), steps, lr, kl_weight, gen, "vae (clips)")


def reconstruct(vae: Any, clips: Any) -> Any:
    """Whole clips through the VAE (latent means), as [-1, 1] floats [N, 3, F, H, W]."""
    import torch

    vae.eval()
    with torch.no_grad():
        return vae.decode(vae.encode(as_input(clips)).latent_dist.mean).sample


def clip_reconstruction_mse(clips: Any, reconstructions: Any) -> list[float]:
    """Per frame, the mean squared error (in [-1, 1]) of whole held-out clips through
    the VAE: every frame of a 17-frame clip must come back."""
    error = (reconstructions - as_input(clips)) ** 2
    return [round(float(v), 5) for v in error.mean(dim=(0, 1, 3, 4))]


def as_frames(videos: Any) -> list[list[Any]]:
    """[-1, 1] videos [N, 3, F, H, W] as lists of uint8 [H, W, 3] frames (what the
    checker reads)."""
    import torch

    pixels = ((videos.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return [list(video) for video in pixels.permute(0, 2, 3, 4, 1).numpy()]


def encode_clips(vae: Any, clips: Any, chunk: int = 8) -> Any:
    """The latent means of whole clips: [N, 16, 5, 8, 8] for 17x64x64 on the temporal
    VAE."""
    import torch
    from tqdm.auto import tqdm

    vae.eval()
    with torch.no_grad():
        return torch.cat(
            [
                vae.encode(as_input(clips[i : i + chunk])).latent_dist.mean
                for i in tqdm(
                    range(0, len(clips), chunk), desc="encode", mininterval=2.0
                )
            ]
        )
