"""Videos as files (``entrypoints/video_encoding.py``): an MP4 with its metadata, and a
video's sound as its AAC track (or a WAV beside PNG frames), read back with PyAV."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from diffserve.entrypoints.video_encoding import (
    encode_mp4,
    read_audio,
    read_mp4,
    write_wav,
)

RATE = 24000


def tone(seconds: float, channels: int = 2) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    wave_ = 0.3 * np.sin(2 * np.pi * 440 * t)
    return np.stack([wave_ * (1 + c) / channels for c in range(channels)]).astype(
        np.float32
    )


def frames(count: int = 9) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (count, 32, 48, 3), dtype=np.uint8)


@pytest.mark.parametrize("channels", [1, 2])
def test_the_audio_is_the_mp4s_track_beside_its_frames(channels: int) -> None:
    sound = tone(0.375, channels)
    data = encode_mp4(frames(), 24, {"seed": "3"}, audio=sound, sample_rate=RATE)
    video, metadata, fps = read_mp4(data)
    assert video.shape == (9, 32, 48, 3) and fps == 24.0 and metadata["seed"] == "3"
    samples, rate = read_audio(data)
    assert rate == RATE and samples.shape[0] == channels
    # AAC adds its encoder delay (a frame of 1024 samples at most) and is lossy: the
    # same length within that, the same loudness within 10%.
    assert 0 <= samples.shape[1] - sound.shape[1] <= 1024
    rms = float(np.sqrt((samples**2).mean()))
    assert abs(rms - float(np.sqrt((sound**2).mean()))) < 0.1 * rms


def test_a_silent_video_has_no_audio_track_and_bad_audio_is_refused() -> None:
    data = encode_mp4(frames(), 24)
    with pytest.raises(ValueError, match="no audio track"):
        read_audio(data)
    with pytest.raises(ValueError, match="1 or 2 channels"):
        encode_mp4(frames(), 24, audio=np.zeros((3, 100), np.float32), sample_rate=RATE)


def test_a_wav_beside_frames_holds_the_same_sound(tmp_path: Path) -> None:
    sound = tone(0.25)
    path = write_wav(tmp_path / "audio.wav", sound, RATE)
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getsampwidth()) == (
            2,
            RATE,
            2,
        )
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
    back = pcm.reshape(-1, 2).T / 32767.0
    assert back.shape == sound.shape and np.abs(back - sound).max() < 1e-4
