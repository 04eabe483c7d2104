"""The video families of the generic path against plain diffusers on the same
directory, prompt and seed (float32): LTX-2's frames and its audio waveform, and
HunyuanVideo-1.5's frames (its guider holds the guidance scale; its ``__call__`` has no
step callback, so its scheduler's step is the engine's step hook). Also what each
declares: its frame rule, and the audio track's sample rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from diffserve import Engine, GenerationRequest
from diffserve.errors import RequestError

PROMPT = "a kite over a beach"


def psnr(a: np.ndarray, b: np.ndarray, peak: float = 255.0) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(peak**2 / mse)


def serve(model_dir: Path) -> Engine:
    return Engine(
        str(model_dir),
        dtype="float32",
        linear_backend="torch",
        attention_backend="sdpa",
        env={},
        deploy_config={"warmup": {"enabled": False}},
    )


def plain(model_dir: Path, class_name: str) -> Any:
    import diffusers

    pipe = getattr(diffusers, class_name).from_pretrained(
        str(model_dir), torch_dtype=torch.float32
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def frames_uint8(frames: Any) -> np.ndarray:
    return (np.asarray(frames) * 255).round().astype(np.uint8)


@pytest.mark.numerics
def test_ltx2_frames_and_audio_match_plain_diffusers(tiny_ltx2_dir: Path) -> None:
    request = dict(height=64, width=64, num_inference_steps=2, guidance_scale=3.0)
    with serve(tiny_ltx2_dir) as engine:
        caps = engine.capabilities
        assert caps is not None and caps.video is not None
        assert (caps.video.temporal_factor, caps.video.audio_sample_rate) == (8, 24000)
        assert caps.modality.name == "video+audio"
        out = engine.generate(
            GenerationRequest(
                prompt=PROMPT,
                seed=5,
                num_frames=9,
                fps=24,
                max_sequence_length=128,
                **request,
            )
        )
        with pytest.raises(RequestError, match="8k\\+1") as info:
            engine.generate(GenerationRequest(prompt=PROMPT, num_frames=10, **request))
        assert info.value.param == "num_frames"
    assert out.videos[0].shape == (9, 64, 64, 3) and not out.images
    assert out.audio_sample_rate == 24000 and out.fps == 24
    (audio,) = out.audios
    pipe = plain(tiny_ltx2_dir, "LTX2Pipeline")
    frames, want_audio = pipe(
        prompt=PROMPT,
        generator=torch.Generator().manual_seed(5),
        num_frames=9,
        frame_rate=24.0,
        max_sequence_length=128,
        output_type="np",
        return_dict=False,
        # What the registry sends: no spatio-temporal guidance pass (LTX-2.0 weights).
        stg_scale=0.0,
        audio_stg_scale=0.0,
        **request,
    )
    assert psnr(out.videos[0], frames_uint8(frames[0])) >= 60.0
    want = want_audio[0].float().numpy()
    assert audio.shape == want.shape and audio.shape[0] == 2
    # A waveform in [-1, 1] (the vocoder's tanh): the same sound, to 60 dB.
    assert psnr(audio, want, peak=2.0) >= 60.0
    assert np.isfinite(audio).all() and float(np.sqrt((audio**2).mean())) > 1e-4
    # Its length is the clip's: (4 x round(seconds x 25) - 3) x 240 samples at 24 kHz.
    assert abs(audio.shape[1] / 24000 - 9 / 24) < 0.1


@pytest.mark.numerics
def test_hunyuan_video_15_frames_match_plain_diffusers(
    tiny_hunyuan_video15_dir: Path,
) -> None:
    with serve(tiny_hunyuan_video15_dir) as engine:
        caps = engine.capabilities
        assert caps is not None and caps.video is not None
        assert (caps.video.temporal_factor, caps.video.audio_sample_rate) == (4, 0)
        assert caps.modality.name == "video"
        steps: list[int] = []
        out = engine.generate(
            GenerationRequest(
                prompt=PROMPT,
                height=32,
                width=32,
                num_inference_steps=2,
                guidance_scale=6.0,
                seed=4,
                num_frames=5,
                max_sequence_length=32,
            ),
            on_progress=lambda event: steps.append(event.step),
        )
        # Guidance 0 is no CFG, as on every family: one forward a step (diffusers'
        # guider would run both branches and keep the unconditional one).
        unguided = engine.generate(
            GenerationRequest(
                prompt=PROMPT,
                height=32,
                width=32,
                num_inference_steps=2,
                guidance_scale=0.0,
                num_frames=1,
                max_sequence_length=32,
            )
        )
        assert unguided.attestation["transformer_forwards"] == 2
        with pytest.raises(RequestError, match="4k\\+1"):
            engine.generate(GenerationRequest(prompt=PROMPT, num_frames=6))
    # The scheduler's step reported each step.
    assert steps == [1, 2]
    assert out.videos[0].shape == (5, 32, 32, 3) and not out.audios
    # CFG from the guider: two forwards a step.
    assert out.attestation["transformer_forwards"] == 4
    pipe = plain(tiny_hunyuan_video15_dir, "HunyuanVideo15Pipeline")
    pipe.tokenizer_max_length = 32  # the request's text window, as the engine sets it
    frames = pipe(
        prompt=PROMPT,
        height=32,
        width=32,
        num_frames=5,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(4),
        output_type="np",
    ).frames
    assert psnr(out.videos[0], frames_uint8(frames[0])) >= 60.0
