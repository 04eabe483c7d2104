"""The ``diffserve`` command. Each subcommand lives in ``entrypoints/commands/<name>.py``.

A command module defines ``register(subparsers) -> None``, which adds its parser and sets
``func=run`` (``run(args) -> int``). Command modules import heavy dependencies inside ``run`` so
``diffserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from diffserve import __version__
from diffserve.errors import DiffserveError
from diffserve.logging import configure_logging

# Order is the order shown in --help.
COMMAND_MODULES = (
    "serve",
    "generate",
    "config",
    "make_model",
    "bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffserve", description="Serve FLUX-class diffusion models.")
    parser.add_argument("--version", action="version", version=f"diffserve {__version__}")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"diffserve.entrypoints.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"diffserve.entrypoints.commands.{name}":
                continue  # command not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    configure_logging(args.log_level)
    try:
        return int(args.func(args) or 0)
    except DiffserveError as exc:
        print(f"diffserve {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
