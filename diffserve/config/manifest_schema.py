"""``server.provenance.*``: the signed manifest every image and video carries
(docs/provenance.md)."""

from __future__ import annotations

from dataclasses import dataclass

from diffserve.config import canonical as c
from diffserve.config import structured as sv
from diffserve.config.options import opt


@dataclass(frozen=True)
class ProvenanceConfig:
    """Each output file embeds a manifest of what made it, signed with Ed25519."""

    enabled: bool = opt(
        True,
        "embed a signed provenance manifest in every image and video",
        c.normalize_bool,
        kind="bool",
    )
    key_file: str = opt(
        "",
        "PEM file of the Ed25519 signing key, which must exist (empty: "
        "state_dir/provenance-ed25519.pem, created on first use)",
        sv.normalize_optional_dir,
    )
