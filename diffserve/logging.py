"""The one logger factory. Every module does ``logger = get_logger(__name__)``."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

_ROOT = "diffserve"
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_configured = False
# Text appended to each line of configure_logging's handler, computed on the logging
# thread: tracing installs one (" trace_id=... span_id=..." while a span is current:
# tracing/log_context.py). None: the plain format.
_line_context: Callable[[], str] | None = None


def get_logger(name: str) -> logging.Logger:
    """Return a logger under the ``diffserve`` namespace."""
    if not name.startswith(_ROOT):
        name = f"{_ROOT}.{name}"
    return logging.getLogger(name)


def set_line_context(context: Callable[[], str] | None) -> None:
    """Install (or, with None, remove) the function whose text ends every log line of
    the ``diffserve`` handler."""
    global _line_context
    _line_context = context


class _Formatter(logging.Formatter):
    """The one line format, plus the line context when one is installed (before any
    traceback lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        context = _line_context
        return text + context() if context is not None else text


def configure_logging(level: str | int | None = None) -> None:
    """Attach one stderr handler to the ``diffserve`` logger. Called by the CLI, never
    on import."""
    global _configured
    root = logging.getLogger(_ROOT)
    if level is None:
        level = os.environ.get("DIFFSERVE_LOG_LEVEL", "INFO")
    root.setLevel(level.upper() if isinstance(level, str) else level)
    if _configured:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_Formatter(_FORMAT))
    root.addHandler(handler)
    root.propagate = False
    _configured = True
