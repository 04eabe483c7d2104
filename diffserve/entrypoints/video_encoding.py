"""Videos as files: H.264 MP4 through PyAV (the ``video`` extra) with the request's
metadata in the container's tags and, for a model that makes sound, its audio as
an AAC track; or one PNG per frame. One module for the CLI and the server, so a video's
metadata reads the same wherever it was made."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from diffserve.errors import ConfigError


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise ConfigError(
            "writing MP4 files needs PyAV",
            path="output",
            hint="pip install 'diffserve[video]' (or write frames as PNGs: -o DIR/)",
        ) from None
    return av


def encode_mp4(
    frames: Any,
    fps: int,
    metadata: dict[str, str] | None = None,
    *,
    crf: int = 18,
    audio: Any = None,
    sample_rate: int = 0,
) -> bytes:
    """``frames`` uint8 ``(F, H, W, 3)`` -> an H.264 (yuv420p) MP4 at ``fps``,
    ``metadata`` as container tags (``use_metadata_tags``: any key survives, read back
    with any FFmpeg or PyAV). ``audio`` float ``(channels, samples)`` in [-1, 1] at
    ``sample_rate`` becomes an AAC track beside the video."""
    import numpy as np

    av = _av()
    array = np.ascontiguousarray(np.asarray(frames))
    if array.dtype != np.uint8 or array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(
            f"frames must be uint8 (F, H, W, 3), got {array.dtype} {array.shape}"
        )
    _, height, width, _ = array.shape
    buffer = io.BytesIO()
    with av.open(
        buffer, mode="w", format="mp4", options={"movflags": "use_metadata_tags"}
    ) as container:
        for key, value in (metadata or {}).items():
            container.metadata[key] = str(value)
        stream = container.add_stream("libx264", rate=int(fps))
        # yuv420p halves the chroma planes: odd sides are padded by one pixel (sizes
        # here are multiples of 16).
        stream.width, stream.height = width + width % 2, height + height % 2
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf)}
        # Every stream exists before the first packet: the first mux writes the header.
        sound = _audio_track(av, container, audio, sample_rate)
        for frame in array:
            if frame.shape[0] != stream.height or frame.shape[1] != stream.width:
                frame = np.pad(
                    frame,
                    ((0, stream.height - height), (0, stream.width - width), (0, 0)),
                    mode="edge",
                )
            for packet in stream.encode(
                av.VideoFrame.from_ndarray(frame, format="rgb24")
            ):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            track, frame = sound
            for packet in [*track.encode(frame), *track.encode()]:
                container.mux(packet)
    return buffer.getvalue()


# PyAV's AAC encoder takes one or two channels (the layouts by count).
_LAYOUTS = {1: "mono", 2: "stereo"}


def _audio_track(
    av: Any, container: Any, audio: Any, sample_rate: int
) -> tuple[Any, Any] | None:
    """The AAC stream for ``audio`` (float ``(channels, samples)``, clipped to [-1, 1]:
    a vocoder's overshoot must not wrap) and its one frame; None without audio."""
    import numpy as np

    if audio is None:
        return None

    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim == 1:
        samples = samples[None]
    if samples.ndim != 2 or samples.shape[0] not in _LAYOUTS or sample_rate <= 0:
        raise ValueError(
            "audio must be float (channels, samples) with 1 or 2 channels and a "
            f"sample rate, got {samples.shape} at {sample_rate} Hz"
        )
    layout = _LAYOUTS[samples.shape[0]]
    stream = container.add_stream("aac", rate=int(sample_rate))
    stream.layout = layout
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(np.clip(samples, -1.0, 1.0)), format="fltp", layout=layout
    )
    frame.sample_rate, frame.pts = int(sample_rate), 0
    return stream, frame


def read_mp4(data: bytes) -> tuple[Any, dict[str, str], float]:
    """``(frames uint8 (F, H, W, 3), metadata, fps)`` of an MP4 (tests and tools)."""
    import numpy as np

    av = _av()
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [
            frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)
        ]
        return (
            np.stack(frames),
            dict(container.metadata),
            float(stream.average_rate or 0),
        )


def read_audio(data: bytes) -> tuple[Any, int]:
    """``(samples float32 (channels, n), sample_rate)`` of an MP4's first audio track
    (AAC's encoder delay included: a few hundred samples more than were written).
    Raises ``ValueError`` when the file has none."""
    import numpy as np

    av = _av()
    with av.open(io.BytesIO(data)) as container:
        if not container.streams.audio:
            raise ValueError("the MP4 has no audio track")
        rate = int(container.streams.audio[0].rate)
        chunks = [frame.to_ndarray() for frame in container.decode(audio=0)]
    return np.concatenate(chunks, axis=1).astype(np.float32), rate


def write_frames(directory: Path, frames: Any, metadata: dict[str, str]) -> list[Path]:
    """One PNG per frame (``frame-0000.png``, ...) in ``directory``, each carrying
    ``metadata``."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    directory.mkdir(parents=True, exist_ok=True)
    info = PngInfo()
    for key, value in metadata.items():
        info.add_text(key, str(value))
    paths = []
    for index, frame in enumerate(frames):
        path = directory / f"frame-{index:04d}.png"
        Image.fromarray(frame).save(path, pnginfo=info)
        paths.append(path)
    return paths


def write_wav(path: Path, audio: Any, sample_rate: int) -> Path:
    """``audio`` float ``(channels, samples)`` in [-1, 1] as a 16-bit PCM WAV (the sound
    of a video written as frames)."""
    import wave

    import numpy as np

    samples = np.asarray(audio, dtype=np.float32)
    samples = samples[None] if samples.ndim == 1 else samples
    pcm = (np.clip(samples, -1.0, 1.0).T * 32767.0).round().astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(samples.shape[0])
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(pcm.tobytes())
    return path
