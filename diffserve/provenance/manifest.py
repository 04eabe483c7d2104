"""The manifest: C2PA-shaped JSON (a claim generator, assertions under C2PA labels, a
content binding), signed with Ed25519 over its canonical form.

Canonical form: UTF-8 JSON with sorted keys and no spaces, of the manifest without its
``signature`` block. The signature block carries the public key (raw, base64), so a file
verifies on its own; ``diffserve verify --key`` also pins whose key it must be.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from diffserve.provenance.facts import Generation

FORMAT = "diffserve.provenance/1"
# The PNG text chunk, MP4 tag and XMP property that hold the manifest.
EMBED_KEY = "diffserve.provenance"
SIGNATURE_ALG = "Ed25519"
HASH_ALG = "sha256"
# IPTC digital source types, as C2PA's c2pa.actions assertion names them.
_IPTC = "http://cv.iptc.org/newscodes/digitalsourcetype/"
TRAINED_ALGORITHMIC = _IPTC + "trainedAlgorithmicMedia"
COMPOSITE_ALGORITHMIC = _IPTC + "compositeWithTrainedAlgorithmicMedia"
GENERATION_LABEL = "diffserve.generation"
# The content bindings: what the hash covers, per kind of file.
PIXELS_LABEL = "diffserve.hash.pixels"
PACKETS_LABEL = "diffserve.hash.packets"


class ManifestError(ValueError):
    """Text that is not a manifest of ours (not JSON, another format, a field
    missing)."""


def canonical(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


def build(
    generation: Generation,
    output: dict[str, Any],
    binding_label: str,
    digest: str,
    version: str,
) -> dict[str, Any]:
    """The unsigned manifest of one file whose content hashes to ``digest``."""
    agent = f"diffserve/{version}"
    action = {
        "action": "c2pa.edited" if generation.edit else "c2pa.created",
        "digitalSourceType": COMPOSITE_ALGORITHMIC
        if generation.edit
        else TRAINED_ALGORITHMIC,
        "softwareAgent": agent,
    }
    return {
        "format": FORMAT,
        "claim_generator": agent,
        "claim_generator_info": [{"name": "diffserve", "version": version}],
        "assertions": [
            {"label": "c2pa.actions", "data": {"actions": [action]}},
            {"label": GENERATION_LABEL, "data": generation.assertion(output)},
            {"label": binding_label, "data": {"alg": HASH_ALG, "hash": digest}},
        ],
    }


def attach_signature(manifest: dict[str, Any], public_key: bytes, value: bytes) -> str:
    """The signed manifest as the text a file embeds."""
    signed = {
        **manifest,
        "signature": {
            "alg": SIGNATURE_ALG,
            "public_key": base64.b64encode(public_key).decode("ascii"),
            "value": base64.b64encode(value).decode("ascii"),
        },
    }
    return canonical(signed).decode("utf-8")


def signed_bytes(manifest: dict[str, Any]) -> bytes:
    """What the signature covers: everything but the signature block."""
    return canonical({k: v for k, v in manifest.items() if k != "signature"})


def parse(text: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"the manifest is not JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestError(f"not a {FORMAT} manifest")
    signature = manifest.get("signature")
    if not isinstance(signature, dict) or signature.get("alg") != SIGNATURE_ALG:
        raise ManifestError(f"the manifest has no {SIGNATURE_ALG} signature")
    if not isinstance(manifest.get("assertions"), list):
        raise ManifestError("the manifest has no assertions")
    return manifest


def assertion(manifest: dict[str, Any], label: str) -> dict[str, Any] | None:
    for entry in manifest.get("assertions", []):
        if isinstance(entry, dict) and entry.get("label") == label:
            data = entry.get("data")
            return data if isinstance(data, dict) else None
    return None


def check_signature(manifest: dict[str, Any]) -> str | None:
    """None when the signature verifies with the embedded key, else why not."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    block = manifest["signature"]
    try:
        key = Ed25519PublicKey.from_public_bytes(
            base64.b64decode(block["public_key"], validate=True)
        )
        value = base64.b64decode(block["value"], validate=True)
    except (KeyError, TypeError, ValueError):
        return "signature block is malformed"
    try:
        key.verify(value, signed_bytes(manifest))
    except InvalidSignature:
        return "signature mismatch: a signed field was changed"
    return None
