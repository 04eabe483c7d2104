"""Videos as files: H.264 MP4 through PyAV (the ``video`` extra) with the request's
metadata in the container's tags, or one PNG per frame. One module for the CLI and the
server, so a video's metadata reads the same wherever it was made."""

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
    frames: Any, fps: int, metadata: dict[str, str] | None = None, *, crf: int = 18
) -> bytes:
    """``frames`` uint8 ``(F, H, W, 3)`` -> an H.264 (yuv420p) MP4 at ``fps``,
    ``metadata`` as container tags (``use_metadata_tags``: any key survives, read back
    with any FFmpeg or PyAV)."""
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
    return buffer.getvalue()


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
