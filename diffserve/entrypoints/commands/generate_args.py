"""``diffserve generate``'s arguments: the prompt, output, request knobs, edit inputs
and every config flag (``config/cli_args.py``)."""

from __future__ import annotations

import argparse


def add_generate_parser(
    subparsers: argparse._SubParsersAction,
) -> argparse.ArgumentParser:
    """The ``generate`` sub-command's arguments (the deploy config's flags included)."""
    from diffserve.config.cli_args import add_config_arguments

    parser = subparsers.add_parser(
        "generate",
        help="generate images from a prompt (no server)",
        usage="diffserve generate [MODEL] PROMPT [-o out.png|out.mp4|DIR/] "
        "[--seed N] [--steps N] [--size WxH] "
        "[-n N] [--num-frames N] [--fps F] [--image in.png "
        "[--image ref.png] [--mask m.png] [--strength S]] "
        "[config flags]",
        description="Generate images locally. MODEL is optional (default: "
        "the toy-shapes demo model).",
    )
    parser.add_argument(
        "words",
        nargs="+",
        metavar="[MODEL] PROMPT",
        help="an optional model directory, then the prompt (quote it)",
    )
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        help="output file (.png, .jpg, .webp; a video model's: .mp4, "
        "or DIR/ for one PNG per frame); "
        "with -n > 1, out-0.png, out-1.png, ... (default out.png, "
        "or out.mp4 for a video model)",
    )
    parser.add_argument(
        "--num-frames",
        type=int,
        default=None,
        help="video models: frames, a multiple of the model's temporal "
        "factor plus 1 (default: the model's, e.g. 81)",
    )
    parser.add_argument(
        "--fps",
        type=int,
        default=None,
        help="video models: frames per second (default: the model's)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the first image (default: random)",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="denoise steps (default: the engine's)"
    )
    parser.add_argument(
        "--size",
        default=None,
        help="WIDTHxHEIGHT, multiples of 16 (default: the model's)",
    )
    parser.add_argument("-n", type=int, default=1, help="number of images (default 1)")
    parser.add_argument("--guidance-scale", type=float, default=None)
    parser.add_argument("--negative-prompt", default=None)
    parser.add_argument(
        "--max-sequence-length",
        type=int,
        default=None,
        help="text tokens per prompt, 1..512 (default: the model's)",
    )
    parser.add_argument(
        "--lora",
        action="append",
        default=None,
        metavar="NAME_OR_FILE[:SCALE]",
        help="apply a LoRA adapter at SCALE (default 1; repeatable): "
        "a name registered with "
        "--lora-modules, or a .safetensors file (registered under its file name)",
    )
    parser.add_argument(
        "--image",
        action="append",
        default=None,
        metavar="FILE",
        help="edit this PNG/JPEG/WEBP image (repeatable: further "
        "images are references, for models "
        "that take them); the output size defaults to the first "
        "image's, rounded down to the "
        "model's multiple",
    )
    parser.add_argument(
        "--mask",
        default=None,
        metavar="FILE",
        help="where to repaint, the size of the first image: with "
        "an alpha channel, transparent "
        "pixels (alpha 0, OpenAI's convention); without one, white pixels (diffusers')",
    )
    parser.add_argument(
        "--strength",
        type=float,
        default=None,
        help="edit strength in (0, 1]: the last fraction of the "
        "schedule that runs from the noised "
        "image; 1 = from pure noise (default: the engine's, 0.6)",
    )
    parser.add_argument(
        "--no-rewrite",
        action="store_true",
        help="skip the deployment's AR stages (kind: ar): draw from "
        "the prompt as written",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="do not draw the progress bar"
    )
    add_config_arguments(parser)
    return parser
