"""The demo model: the trained toy-shapes FLUX.1 shipped in the package
(``diffserve/assets/toy-shapes``), served and used by ``generate`` when no model is
named."""

from __future__ import annotations

from pathlib import Path

from diffserve.logging import get_logger
from diffserve.zoo.components import shipped_model_dir

logger = get_logger(__name__)

# the demo model: diffserve/assets/toy-shapes (trained by diffserve.zoo.toy_shapes)
TOY_ASSET = "toy-shapes"


def ensure_demo_model() -> Path:
    """Return the demo model: the shipped, trained toy-shapes FLUX.1
    (``toy_model_dir``).

    Nothing is built: the weights ship with the package.
    """
    path = toy_model_dir()
    logger.info(
        "using %s: the toy-shapes model (draws 'a red circle "
        "on a blue background' and the like)",
        path,
    )
    return path


def toy_model_dir() -> Path:
    """The trained toy-shapes pipeline shipped in the package
    (``diffserve/assets/toy-shapes``)."""
    return shipped_model_dir(TOY_ASSET)
