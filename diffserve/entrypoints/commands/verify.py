"""``diffserve verify FILE [--key PEM] [--json]``: check the signed provenance manifest
of an image or video diffserve made (docs/provenance.md).

Exit status: 0 the file verifies; 1 it does not (no manifest, a signed field changed,
pixels or frames changed, another key signed it); 2 a usage error (no such file, not a
PNG/JPEG/WEBP/MP4, an unreadable --key).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diffserve.provenance.verify import Verdict

INVALID = 1
USAGE = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check the signed provenance manifest of an image or video",
        description="Check that FILE carries a valid diffserve provenance manifest: "
        "its signature verifies and its pixels (or video and audio packets) are the "
        "ones signed. Exit 0 valid, 1 invalid, 2 usage error.",
    )
    parser.add_argument("file", metavar="FILE", help="a PNG, JPEG, WEBP or MP4")
    parser.add_argument(
        "--key",
        default=None,
        metavar="PEM",
        help="the Ed25519 key (public or private PEM) that must have signed it",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the verdict as one JSON object"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diffserve.provenance.verify import (
        UnsupportedFile,
        public_key_from_pem,
        verify_bytes,
    )

    trusted = None
    try:
        if args.key is not None:
            trusted = public_key_from_pem(Path(args.key).read_bytes())
        data = Path(args.file).read_bytes()
        verdict = verify_bytes(data, trusted)
    except (OSError, UnsupportedFile, ValueError) as exc:
        detail = getattr(exc, "strerror", None) or exc
        print(f"diffserve verify: error: {detail}", file=sys.stderr)
        return USAGE
    if args.json:
        print(json.dumps(as_json(args.file, verdict), sort_keys=True))
    else:
        print(summary(args.file, verdict))
    return 0 if verdict.valid else INVALID


def as_json(path: str, verdict: Verdict) -> dict[str, Any]:
    return {
        "file": path,
        "valid": verdict.valid,
        "reason": verdict.reason,
        "format": verdict.file_format,
        "public_key": verdict.public_key,
        "manifest": verdict.manifest,
    }


def summary(path: str, verdict: Verdict) -> str:
    """A few lines: the verdict, then what the manifest says made the file."""
    head = (
        f"{path}: valid ({verdict.file_format}, signed by {verdict.public_key})"
        if verdict.valid
        else f"{path}: INVALID: {verdict.reason}"
    )
    facts = verdict.generation
    if not facts:
        return head
    kernels = ", ".join(
        f"{kind}={'+'.join(names)}" for kind, names in facts.get("kernels", {}).items()
    )
    rows = [
        ("model", facts.get("model")),
        ("weights fingerprint", facts.get("weights_fingerprint")),
        ("config fingerprint", facts.get("config_fingerprint")),
        ("seed", facts.get("seed")),
        ("steps", facts.get("steps")),
        ("prompt sha256", facts.get("prompt_sha256")),
        ("revised prompt", facts.get("revised_prompt")),
        ("kernels", kernels),
    ]
    return "\n".join(
        [
            head,
            *(f"  {name}: {value}" for name, value in rows if value not in (None, "")),
        ]
    )
