"""Checking a file: find its manifest, check the signature (no signed field changed),
the signer (with a trusted key), the format it was signed as, and the content hash (no
pixel, frame or audio packet changed)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from diffserve.provenance import manifest as m


class UnsupportedFile(ValueError):
    """Not a PNG, JPEG, WEBP or MP4 (or not readable as one)."""


@dataclass
class Verdict:
    valid: bool
    reason: str  # "ok", or why the file does not verify
    file_format: str
    manifest: dict[str, Any] | None = None
    public_key: str | None = None
    generation: dict[str, Any] = field(default_factory=dict)


def sniff(data: bytes) -> str:
    """The file's format from its first bytes."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:8] == b"ftyp":
        return "mp4"
    raise UnsupportedFile("not a PNG, JPEG, WEBP or MP4 file")


def verify_bytes(data: bytes, trusted_key: bytes | None = None) -> Verdict:
    """The verdict on a file's bytes; ``trusted_key``: the raw Ed25519 public key that
    must have signed it."""
    fmt = sniff(data)
    try:
        if fmt == "mp4":
            from diffserve.provenance.video import read_mp4

            text, digest = read_mp4(data)
            label = m.PACKETS_LABEL
        else:
            from diffserve.provenance.images import read_image

            text, digest, _ = read_image(data)
            label = m.PIXELS_LABEL
    except UnsupportedFile:
        raise
    except Exception as exc:  # noqa: BLE001 - a decoder's error: the file is damaged
        raise UnsupportedFile(f"cannot read the {fmt} file: {exc}") from None
    if text is None:
        return Verdict(False, "no provenance manifest in the file", fmt)
    try:
        manifest = m.parse(text)
    except m.ManifestError as exc:
        return Verdict(False, str(exc), fmt)
    verdict = Verdict(
        False,
        "",
        fmt,
        manifest,
        str(manifest["signature"].get("public_key")),
        m.assertion(manifest, m.GENERATION_LABEL) or {},
    )
    verdict.reason = _problem(manifest, fmt, label, digest, trusted_key) or "ok"
    verdict.valid = verdict.reason == "ok"
    return verdict


def _problem(
    manifest: dict[str, Any],
    fmt: str,
    label: str,
    digest: str,
    trusted_key: bytes | None,
) -> str | None:
    problem = m.check_signature(manifest)
    if problem:
        return problem
    if trusted_key is not None:
        signer = manifest["signature"]["public_key"]
        if signer != base64.b64encode(trusted_key).decode("ascii"):
            return f"untrusted key: signed by {signer}, not by the key given"
    output = (m.assertion(manifest, m.GENERATION_LABEL) or {}).get("output", {})
    if output.get("format") != fmt:
        return f"format mismatch: signed as {output.get('format')}, the file is {fmt}"
    binding = m.assertion(manifest, label)
    if binding is None or binding.get("alg") != m.HASH_ALG:
        return f"the manifest has no {label} content binding"
    if binding.get("hash") != digest:
        what = "frames or audio" if fmt == "mp4" else "pixels"
        return f"content hash mismatch: the {what} changed since signing"
    return None


def public_key_from_pem(data: bytes) -> bytes:
    """The raw Ed25519 public key of a PEM public or private key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
        load_pem_public_key,
    )

    key: Any
    try:
        key = load_pem_public_key(data)
    except ValueError:
        try:
            key = load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            raise ValueError("not a PEM public or unencrypted private key") from None
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"a {type(key).__name__}, not an Ed25519 key")
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)
