"""Encode generated images as PNG / JPEG / WEBP bytes.

PNGs carry the prompt, seed, steps and config fingerprint as text chunks so a file found
later on disk still says how to reproduce it; with ``provenance``, every format carries
a signed manifest too (diffserve/provenance, docs/provenance.md). Encoding is CPU work:
callers run it off the event loop.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diffserve.provenance.keys import Signing

MIME_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
# Quality used for lossy formats when the request gives no output_compression (OpenAI's
# default).
DEFAULT_QUALITY = 100
# Longest metadata text kept in a PNG: every image of a request would otherwise carry a
# copy of a prompt as long as the server accepts.
MAX_METADATA_CHARS = 1000
TRUNCATED_MARKER = "...[truncated]"


def clip_text(value: str, limit: int = MAX_METADATA_CHARS) -> str:
    """``value`` cut to ``limit`` characters, the cut marked so nobody mistakes it for
    the prompt."""
    if len(value) <= limit:
        return value
    return value[: limit - len(TRUNCATED_MARKER)] + TRUNCATED_MARKER


def encode_image(
    image: Any,
    output_format: str,
    *,
    compression: int | None = None,
    metadata: dict[str, str] | None = None,
    manifest: str | None = None,
) -> bytes:
    """Encode one PIL image. ``compression`` (0-100) is the quality of jpeg/webp and,
    for png, maps onto zlib levels 0-9 (png stays lossless). ``manifest``: a signed
    provenance manifest to embed."""
    from PIL import PngImagePlugin

    from diffserve.provenance.images import add_to_png, save_options

    buf = io.BytesIO()
    if output_format == "png":
        info = PngImagePlugin.PngInfo()
        for key, value in (metadata or {}).items():
            info.add_text(key, clip_text(str(value)))
        add_to_png(info, manifest)
        level = 6 if compression is None else round(compression * 9 / 100)
        image.save(buf, format="PNG", pnginfo=info, compress_level=level)
    elif output_format == "jpeg":
        opaque(image).save(
            buf,
            format="JPEG",
            quality=_quality(compression),
            **save_options("jpeg", manifest),
        )
    elif output_format == "webp":
        image.save(
            buf,
            format="WEBP",
            quality=_quality(compression),
            **save_options("webp", manifest),
        )
    else:  # protocol.py only admits the three formats above
        raise ValueError(f"unsupported output_format {output_format!r}")
    return buf.getvalue()


def opaque(image: Any) -> Any:
    """``image`` without an alpha channel, for formats that have none (JPEG): an RGBA
    image (a model that draws transparency) composited over white, not its alpha
    dropped (which shows whatever color the transparent pixels hold)."""
    from PIL import Image

    if image.mode != "RGBA":
        return image.convert("RGB")
    white = Image.new("RGB", image.size, (255, 255, 255))
    white.paste(image, mask=image.getchannel("A"))
    return white


def _quality(compression: int | None) -> int:
    # PIL's JPEG quality tops out at 95 in its docs; 100 still works and is what OpenAI
    # means by default.
    return DEFAULT_QUALITY if compression is None else max(1, compression)


def encode_all(
    images: list[Any],
    seeds: list[int],
    output_format: str,
    compression: int | None,
    base_metadata: dict[str, str],
    provenance: Signing | None = None,
) -> list[bytes]:
    """Encode every image of a request, each PNG tagged with its own seed; with
    ``provenance``, each signed."""
    return [
        encode_one(
            img,
            output_format,
            compression,
            {**base_metadata, "seed": str(seed)},
            None if provenance is None else provenance.for_seed(seed),
        )
        for img, seed in zip(images, seeds, strict=True)
    ]


def encode_one(
    image: Any,
    output_format: str,
    compression: int | None,
    metadata: dict[str, str],
    provenance: Signing | None,
) -> bytes:
    """One image, signed when ``provenance`` is given."""

    def encode(manifest: str | None) -> bytes:
        return encode_image(
            image,
            output_format,
            compression=compression,
            metadata=metadata,
            manifest=manifest,
        )

    if provenance is None:
        return encode(None)
    from diffserve.provenance.images import sign_image

    return sign_image(image, output_format, encode, provenance)
