"""MP4s: the manifest binds the demuxed streams (each stream's codec, its decoder
setup and its packets' bytes in order; streams hashed apart, so a muxer that interleaves
them differently does not matter), so the container tag that carries it is outside what
it hashes and a changed frame or audio packet breaks it.

The video is encoded first, hashed, then remuxed (packets copied, not re-encoded) with
the manifest in the container's metadata (``use_metadata_tags``: a custom key survives
FFmpeg and PyAV).
"""

from __future__ import annotations

import hashlib
import io
from typing import Any

from diffserve.provenance import manifest as m
from diffserve.provenance.keys import Signing

# What the demuxer reports of the file type box and the muxer: not tags to copy.
_CONTAINER_KEYS = frozenset(
    {"major_brand", "minor_version", "compatible_brands", "encoder"}
)


def packet_digest(container: Any) -> str:
    """The hash of an open input container's streams and packets."""
    streams = {}
    for stream in container.streams:
        context = stream.codec_context
        streams[stream.index] = hashlib.sha256(
            f"{stream.index}:{stream.type}:{context.name}\n".encode()
            + (context.extradata or b"")
        )
    for packet in container.demux():
        if packet.size == 0:  # the demuxer's end-of-stream markers
            continue
        part = streams[packet.stream.index]
        part.update(f"\n{packet.size}\n".encode())
        part.update(bytes(packet))
    digest = hashlib.sha256()
    for index in sorted(streams):
        digest.update(streams[index].digest())
    return digest.hexdigest()


def sign_mp4(data: bytes, signing: Signing, output: dict[str, Any]) -> bytes:
    """``data`` (an MP4) remuxed with the signed manifest of ``signing.generation``;
    ``output``: what the file holds (width, height, frames, fps, audio)."""
    import av

    with av.open(io.BytesIO(data), mode="r") as source:
        digest = packet_digest(source)
    manifest = m.build(
        signing.generation,
        {"kind": "video", "format": "mp4", **output},
        m.PACKETS_LABEL,
        digest,
        signing.version,
    )
    return remux(data, {m.EMBED_KEY: signing.signer.sign(manifest)})


def remux(data: bytes, tags: dict[str, str]) -> bytes:
    """``data`` with ``tags`` added to its container metadata, packets unchanged."""
    import av

    out = io.BytesIO()
    with (
        av.open(io.BytesIO(data), mode="r") as source,
        av.open(
            out, mode="w", format="mp4", options={"movflags": "use_metadata_tags"}
        ) as target,
    ):
        for key, value in {**source.metadata, **tags}.items():
            if key not in _CONTAINER_KEYS:
                target.metadata[key] = value
        streams = {
            stream.index: target.add_stream_from_template(stream)
            for stream in source.streams
        }
        for packet in source.demux():
            if packet.dts is None:
                continue
            packet.stream = streams[packet.stream.index]
            target.mux(packet)
    return out.getvalue()


def read_mp4(data: bytes) -> tuple[str | None, str]:
    """``(manifest text or None, packet digest)`` of an MP4."""
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        text = container.metadata.get(m.EMBED_KEY)
        return text, packet_digest(container)
