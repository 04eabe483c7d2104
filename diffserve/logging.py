"""The one logger factory. Every module does ``logger = get_logger(__name__)``."""

from __future__ import annotations

import logging
import os

_ROOT = "diffserve"
_configured = False


def get_logger(name: str) -> logging.Logger:
    """Return a logger under the ``diffserve`` namespace."""
    if not name.startswith(_ROOT):
        name = f"{_ROOT}.{name}"
    return logging.getLogger(name)


def configure_logging(level: str | int | None = None) -> None:
    """Attach one stderr handler to the ``diffserve`` logger. Called by the CLI, never on import."""
    global _configured
    root = logging.getLogger(_ROOT)
    if level is None:
        level = os.environ.get("DIFFSERVE_LOG_LEVEL", "INFO")
    root.setLevel(level.upper() if isinstance(level, str) else level)
    if _configured:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.propagate = False
    _configured = True
