"""The models ``test_backend_runtime.py`` proves its deploy settings on: per model, the
fixture that builds it, the request it serves, what its denoiser runs for that request
and what comes back (an image, a video's frames, and LTX-2's audio)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diffserve import GenerationRequest

# Every model's request: 2 steps, no CFG where the family allows it.
BASE_REQUEST: dict[str, Any] = dict(
    prompt="a fox",
    num_inference_steps=2,
    guidance_scale=0.0,
    seed=42,
    n=1,
    max_sequence_length=64,
)
AT_128 = dict(height=128, width=128)
AT_64 = dict(height=64, width=64)


@dataclass(frozen=True)
class RuntimeModel:
    fixture: str  # the session fixture that builds the tiny model
    family: str  # the attestation's model_family
    generic: bool  # diffusers' pipeline class with its denoiser on our kernels
    request: dict[str, Any]  # on top of BASE_REQUEST
    # Each denoiser forward's output (the first of a tuple), in order: one request's
    # forwards.
    forward_shapes: tuple[list[int], ...]
    pixels: tuple[int, ...]  # (frames, height, width, channels) of what comes back
    audio_sample_rate: int = 0  # the video's waveform, 0: silent
    # The family's own attestation entries: the keys named must read so.
    attested: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def forwards(self) -> int:
        return len(self.forward_shapes)

    @property
    def video(self) -> bool:
        return "num_frames" in self.request

    def generation_request(self) -> GenerationRequest:
        return GenerationRequest(**{**BASE_REQUEST, **self.request})


MODELS = {
    # 8x8 tokens of 2x2 packed latents at 128x128 (FLUX, Qwen-Image: 16 channels,
    # FLUX.2: 32); SD3's latents unpacked.
    "flux": RuntimeModel(
        fixture="tiny_flux_dir",
        family="FluxPipeline",
        generic=False,
        request=AT_128,
        forward_shapes=([1, 64, 64],) * 2,
        pixels=(1, 128, 128, 3),
    ),
    "sd3": RuntimeModel(
        fixture="tiny_sd3_dir",
        family="StableDiffusion3Pipeline",
        generic=True,
        request=AT_128,
        forward_shapes=([1, 16, 16, 16],) * 2,
        pixels=(1, 128, 128, 3),
    ),
    # Wan (tiny-wan22, two experts): of the 2 steps, the first is the high-noise
    # expert's, the second the low-noise one's (boundary 875; timesteps 999 and 750).
    "wan": RuntimeModel(
        fixture="tiny_wan22_dir",
        family="WanPipeline",
        generic=False,
        request={**AT_128, "num_frames": 9},
        forward_shapes=([1, 16, 3, 16, 16],) * 2,
        pixels=(9, 128, 128, 3),
        attested={"experts": {"steps": ["transformer", "transformer_2"]}},
    ),
    "qwen": RuntimeModel(
        fixture="tiny_qwen_image_dir",
        family="QwenImagePipeline",
        generic=True,
        request=AT_128,
        forward_shapes=([1, 64, 64],) * 2,
        pixels=(1, 128, 128, 3),
    ),
    "klein": RuntimeModel(
        fixture="tiny_flux2_klein_dir",
        family="Flux2KleinPipeline",
        generic=True,
        request=AT_128,
        forward_shapes=([1, 64, 128],) * 2,
        pixels=(1, 128, 128, 3),
    ),
    # RGBA images; a guidance scale up to 1 is no CFG: one forward a step. The first
    # fills the prefix KV cache and returns the whole sequence (10 prefix tokens, then
    # the image's 4x4 tokens of 2x2 packed latents), the second reads the cache.
    "qwen21": RuntimeModel(
        fixture="tiny_qwen_image21_dir",
        family="QwenImage21Pipeline",
        generic=True,
        request=AT_64,
        forward_shapes=([1, 26, 64], [1, 16, 64]),
        pixels=(1, 64, 64, 4),
        attested={"prefix_kv_cache": {"prefills": 1, "hits": 1, "uncached": 0}},
    ),
    # A video and its audio: at any guidance scale its audio CFG and modality guidance
    # run 2 forwards a step, batch 2 for CFG, then one more; 2x2x2 video tokens.
    "ltx2": RuntimeModel(
        fixture="tiny_ltx2_dir",
        family="LTX2Pipeline",
        generic=True,
        request={**AT_64, "num_frames": 9, "fps": 24},
        forward_shapes=([2, 8, 128], [1, 8, 128]) * 2,
        pixels=(9, 64, 64, 3),
        audio_sample_rate=24000,
    ),
    # A silent video. Guidance 1 turns its guider's CFG off (one forward a step); at 0
    # diffusers' guider runs CFG (two), keeping the unconditional prediction.
    "hunyuan15": RuntimeModel(
        fixture="tiny_hunyuan_video15_dir",
        family="HunyuanVideo15Pipeline",
        generic=True,
        request=dict(
            height=32,
            width=32,
            num_frames=5,
            guidance_scale=1.0,
            max_sequence_length=32,
        ),
        forward_shapes=([1, 32, 2, 2, 2],) * 2,
        pixels=(5, 32, 32, 3),
    ),
}


def pixels(model: RuntimeModel, out: Any) -> np.ndarray:
    """What came back as (frames, height, width, channels) uint8: the video's frames, or
    the image as one frame (RGBA where the family's VAE decodes four channels)."""
    if model.video:
        assert not out.images and len(out.videos) == 1, (out.images, out.videos)
        frames = np.asarray(out.videos[0])
    else:
        assert not out.videos and len(out.images) == 1, (out.images, out.videos)
        frames = np.asarray(out.images[0])[None]
    assert frames.shape == model.pixels and frames.dtype == np.uint8, frames.shape
    return frames


def audio(model: RuntimeModel, out: Any) -> np.ndarray | None:
    """The video's waveform, finite and not silent, (2, samples) at the family's rate;
    None for a silent model (which must return none)."""
    assert out.audio_sample_rate == model.audio_sample_rate
    if not model.audio_sample_rate:
        assert not out.audios, out.audios
        return None
    assert len(out.audios) == 1
    wave = np.asarray(out.audios[0])
    assert wave.dtype == np.float32 and wave.ndim == 2 and wave.shape[0] == 2
    assert wave.shape[1] > 0 and np.isfinite(wave).all() and np.abs(wave).max() > 0
    return wave


def output_bytes(model: RuntimeModel, out: Any) -> bytes:
    """The pixels' bytes, then the audio's: what the same seed must reproduce."""
    wave = audio(model, out)
    return pixels(model, out).tobytes() + (b"" if wave is None else wave.tobytes())
