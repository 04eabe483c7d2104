"""``diffserve make-model {tiny-flux,small-flux} DIR``: write a hermetic random-weight FLUX model."""

from __future__ import annotations

import argparse
from pathlib import Path

# Kept in sync with diffserve.models.tiny_configs.SPECS (a test checks it); listed here so that
# building the parser stays import-light.
MODEL_KINDS = ("tiny-flux", "small-flux")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-model",
        help="write a random-weight FLUX.1-shaped pipeline directory (no download)",
        description=(
            "Write a FLUX.1 pipeline directory in diffusers layout with random weights from a seeded "
            "generator. tiny-flux is for tests and demos, small-flux (~150M parameters) for benchmarks. "
            "The same seed gives byte-identical files."
        ),
    )
    parser.add_argument("kind", choices=MODEL_KINDS, help="which model to build")
    parser.add_argument("dir", type=Path, metavar="DIR", help="output directory (created; must be empty)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--guidance-embeds", action="store_true",
                        help="dev-like guidance-distilled transformer (default: schnell-like)")
    parser.add_argument("--force", action="store_true", help="replace an existing model directory at DIR")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diffserve.models.tiny import build_flux_model, check_target

    # Fail on a bad DIR before paying for the torch/diffusers imports of the build.
    check_target(Path(args.dir).expanduser().absolute(), force=args.force)
    out = build_flux_model(args.kind, args.dir, seed=args.seed, guidance_embeds=args.guidance_embeds,
                           force=args.force)
    print(out)
    return 0
