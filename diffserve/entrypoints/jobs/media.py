"""A finished video's files: the MP4 (``video_encoding.encode_mp4``), its first frame as
a WEBP thumbnail and a sprite sheet (evenly spaced frames in a grid, JPEG), each written
straight to the temporary path ``ArtifactDir.publish`` hands over."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from diffserve.entrypoints.video_encoding import encode_mp4
from diffserve.provenance.keys import Signing

SPRITE_TILES = 16  # frames in a sprite sheet, at most
SPRITE_COLUMNS = 4


def write_mp4(
    path: Path,
    frames: Any,
    fps: int,
    metadata: dict[str, str],
    audio: Any = None,
    sample_rate: int = 0,
    signing: Signing | None = None,
) -> None:
    """The MP4, with ``audio`` as its AAC track when the model made sound, signed with
    ``signing`` (docs/provenance.md)."""
    data = encode_mp4(frames, fps, metadata, audio=audio, sample_rate=sample_rate)
    if signing is not None:
        from diffserve.provenance.video import sign_mp4

        count, height, width = frames.shape[:3]
        data = sign_mp4(
            data,
            signing,
            {
                "width": int(width),
                "height": int(height),
                "frames": int(count),
                "fps": int(fps),
                "audio": audio is not None,
            },
        )
    path.write_bytes(data)


def write_thumbnail(path: Path, frames: Any) -> None:
    """The first frame, lossless WEBP (the same pixels as the video's first decoded
    frame before H.264)."""
    from PIL import Image

    Image.fromarray(frames[0]).save(path, format="WEBP", lossless=True)


def sprite_frames(count: int, tiles: int = SPRITE_TILES) -> list[int]:
    """Which frames a sprite sheet shows: ``tiles`` evenly spaced indices from the first
    to the last."""
    if count <= tiles:
        return list(range(count))
    return [round(i * (count - 1) / (tiles - 1)) for i in range(tiles)]


def write_spritesheet(path: Path, frames: Any) -> None:
    """Up to ``SPRITE_TILES`` frames, left to right then top to bottom, in a JPEG grid
    of ``SPRITE_COLUMNS``."""
    import numpy as np
    from PIL import Image

    picks = sprite_frames(len(frames))
    columns = min(SPRITE_COLUMNS, len(picks))
    rows = math.ceil(len(picks) / columns)
    height, width = frames[0].shape[:2]
    sheet = np.zeros((rows * height, columns * width, 3), dtype=np.uint8)
    for tile, index in enumerate(picks):
        row, column = divmod(tile, columns)
        sheet[
            row * height : (row + 1) * height, column * width : (column + 1) * width
        ] = frames[index]
    Image.fromarray(sheet).save(path, format="JPEG", quality=90)
