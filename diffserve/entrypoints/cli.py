"""The ``diffserve`` command. Each subcommand lives in
``entrypoints/commands/<name>.py``.

A command module defines ``register(subparsers) -> None``, which adds its parser and
sets ``func=run`` (``run(args) -> int``). Command modules import heavy dependencies
inside ``run`` so ``diffserve --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from diffserve import __version__
from diffserve.errors import DiffserveError, ModelLoadError
from diffserve.logging import configure_logging

# Order is the order shown in --help.
COMMAND_MODULES = (
    "serve",
    "generate",
    "verify",
    "config",
    "models",
    "make_model",
    "bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffserve",
        description="Serve diffusion transformers (images and videos) "
        "behind OpenAI-compatible APIs.",
    )
    parser.add_argument(
        "--version", action="version", version=f"diffserve {__version__}"
    )
    parser.add_argument(
        "--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR"
    )
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


# Exit status of a command stopped by a model file it cannot load (missing, truncated,
# of another model, ...); a config or request error is 1.
MODEL_FILE_ERROR = 2

# One-shot commands: run as the process's own command (argv None), they end it without
# the interpreter's teardown (``_exit_now``).
FAST_EXIT_COMMANDS = frozenset({"generate"})


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    configure_logging(args.log_level)
    try:
        code = int(args.func(args) or 0)
    except DiffserveError as exc:
        print(f"diffserve {args.command}: error: {exc}", file=sys.stderr)
        code = MODEL_FILE_ERROR if isinstance(exc, ModelLoadError) else 1
    except KeyboardInterrupt:
        code = 130
    if argv is None and args.command in FAST_EXIT_COMMANDS:
        _exit_now(code)
    return code


def _exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's teardown, which frees torch's,
    transformers' and diffusers' modules and native libraries one by one: about 0.8 s on
    2 cores, a sixth of a tiny-model ``generate``. What a normal exit does that matters
    still happens, in the same order: other non-daemon threads are joined, the atexit
    handlers run (logging, multiprocessing, ray, torch), stdout and stderr are
    flushed."""
    import atexit
    import contextlib
    import os
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
