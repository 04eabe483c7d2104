"""Images: the manifest binds the decoded pixels (mode, size, raw bytes), so the chunk
that carries it is outside what it hashes and one changed pixel breaks it. PNG keeps it
in an iTXt chunk, JPEG in its comment segment, WEBP in an XMP packet.

A lossy file is encoded without the manifest first, decoded and hashed, then encoded
again with it: the encoders are deterministic and metadata never reaches the pixel
data, so the final file decodes to the hashed pixels (tests/provenance checks it).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from typing import Any
from xml.sax.saxutils import quoteattr

from diffserve.provenance import manifest as m
from diffserve.provenance.keys import Signing

# Modes a PNG stores and decodes unchanged: hashed from the image as given, no
# round trip.
_PNG_LOSSLESS_MODES = frozenset({"RGB", "RGBA", "L", "LA"})
_XMP_NS = "https://diffserve.dev/ns/provenance/1.0/"


def pixel_digest(image: Any) -> str:
    digest = hashlib.sha256(f"{image.mode}:{image.width}x{image.height}\n".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def save_options(output_format: str, text: str | None) -> dict[str, Any]:
    """Pillow ``save`` keywords that embed ``text`` (JPEG, WEBP); PNG's goes through
    ``add_to_png``."""
    if text is None or output_format == "png":
        return {}
    if output_format == "jpeg":
        return {"comment": text.encode("utf-8")}
    if output_format == "webp":
        return {"xmp": xmp_packet(text)}
    raise ValueError(f"no provenance embedding for {output_format!r}")


def add_to_png(info: Any, text: str | None) -> None:
    if text is not None:
        info.add_itxt(m.EMBED_KEY, text)


def xmp_packet(text: str) -> bytes:
    return (
        '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
        'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        f'<rdf:Description xmlns:diffserve="{_XMP_NS}" '
        f"diffserve:provenance={quoteattr(text)}/></rdf:RDF></x:xmpmeta>"
    ).encode()


def from_xmp(packet: bytes | str) -> str | None:
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(packet)
    except ET.ParseError:
        return None
    for element in root.iter():
        value = element.get(f"{{{_XMP_NS}}}provenance")
        if value is not None:
            return value
    return None


def sign_image(
    image: Any,
    output_format: str,
    encode: Callable[[str | None], bytes],
    signing: Signing,
) -> bytes:
    """``encode(manifest_text_or_None) -> file bytes`` with the signed manifest of
    ``signing.generation`` embedded."""
    from PIL import Image

    if output_format == "png" and image.mode in _PNG_LOSSLESS_MODES:
        digest = pixel_digest(image)
    else:
        with Image.open(io.BytesIO(encode(None))) as plain:
            digest = pixel_digest(plain)
    output = {
        "kind": "image",
        "format": output_format,
        "width": image.width,
        "height": image.height,
    }
    manifest = m.build(
        signing.generation, output, m.PIXELS_LABEL, digest, signing.version
    )
    return encode(signing.signer.sign(manifest))


def read_image(data: bytes) -> tuple[str | None, str, str]:
    """``(manifest text or None, pixel digest, format)`` of an image file."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image.load()
        fmt = (image.format or "").lower()
        text: str | None = None
        if fmt == "png":
            found = getattr(image, "text", {}).get(m.EMBED_KEY)
            text = str(found) if found is not None else None
        elif fmt == "jpeg":
            comment = image.info.get("comment")
            text = comment.decode("utf-8", "replace") if comment else None
        elif fmt == "webp":
            packet = image.info.get("xmp")
            text = from_xmp(packet) if packet else None
        return text, pixel_digest(image), fmt
