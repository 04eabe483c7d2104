"""The bounds of a request's fields and the checks of its compound ones (an edit's
inputs, LoRA adapters, finite numbers), run when a ``GenerationRequest`` is built
(``RequestError`` naming the bad value and the fix: HTTP 400)."""

from __future__ import annotations

import math
from typing import Any

from diffserve.errors import RequestError

MAX_SEED = 2**63 - 1
# Upper bounds of the float knobs: far above any useful value, and a bound keeps a typo
# (or 1e308) from reaching the sampler as an overflow.
MAX_GUIDANCE_SCALE = 100.0
MAX_TRUE_CFG_SCALE = 100.0
# The config's bound too; a deployment sets a tighter cache.max_threshold.
MAX_CACHE_THRESHOLD = 100.0
# A sanity bound; a deployment's server.max_frames is the real limit.
MAX_FRAMES = 10_000
MAX_FPS = 240
MAX_INPUT_IMAGES = 4  # images per edit request (the HTTP layer may bound it lower)
MAX_PARTIAL_IMAGES = 3  # OpenAI's bound on a streamed request's partial images


def check_edit_inputs(
    images: tuple[Any, ...], mask: Any, strength: float | None
) -> None:
    """Shapes and types of an edit's inputs (sizes against the model are checked at
    admission)."""
    if len(images) > MAX_INPUT_IMAGES:
        raise RequestError(
            f"{len(images)} input images; at most {MAX_INPUT_IMAGES}", param="image"
        )
    for image in images:
        shape, dtype = getattr(image, "shape", None), str(getattr(image, "dtype", ""))
        if (
            shape is None
            or len(shape) != 3
            or shape[2] != 3
            or dtype != "uint8"
            or min(shape[:2]) < 1
        ):
            raise RequestError(
                f"input images must be uint8 RGB arrays [H, W, 3], got {dtype} {shape}",
                param="image",
            )
    if mask is not None:
        if not images:
            raise RequestError("a mask needs an image to edit", param="mask")
        shape, dtype = getattr(mask, "shape", None), str(getattr(mask, "dtype", ""))
        if (
            shape is None
            or tuple(shape) != tuple(images[0].shape[:2])
            or dtype != "uint8"
        ):
            raise RequestError(
                "the mask must be uint8 [H, W] of the image's size "
                f"{tuple(images[0].shape[:2])}, "
                f"got {dtype} {shape}",
                param="mask",
            )
    if strength is not None:
        if (
            isinstance(strength, bool)
            or not isinstance(strength, (int, float))
            or not 0 < strength <= 1
        ):
            raise RequestError(
                f"strength={strength!r} must be a number in (0, 1]", param="strength"
            )
        if not images:
            raise RequestError("strength needs an input image", param="strength")


# The config's bound too; a deployment sets a tighter max_lora_scale.
MAX_LORA_SCALE = 100.0


def lora_pairs(value: Any) -> tuple[tuple[str, float], ...]:
    """``[(name, scale), ...]`` (or ``{"name": ..., "scale": ...}`` items) as a tuple of
    pairs, checked."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise RequestError(
            f"loras={value!r} must be a list of (name, scale)", param="loras"
        )
    pairs = []
    for item in value:
        if isinstance(item, dict):
            name, scale = item.get("name"), item.get("scale", 1.0)
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            name, scale = item
        else:
            raise RequestError(
                f"loras item {item!r} must be (name, scale)", param="loras"
            )
        if not isinstance(name, str) or not name.strip() or len(name) > 1024:
            raise RequestError(
                f"loras name {name!r} must be a non-empty string", param="loras"
            )
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or abs(scale) > MAX_LORA_SCALE
        ):
            raise RequestError(
                f"loras scale {scale!r} of {name!r} must be a finite number in "
                f"[-{MAX_LORA_SCALE:g}, {MAX_LORA_SCALE:g}]",
                param="loras",
            )
        pairs.append((name.strip(), float(scale)))
    if len({name for name, _ in pairs}) != len(pairs):
        raise RequestError(
            "loras names must be unique (combine scales into one entry)", param="loras"
        )
    return tuple(pairs)


def check_int(value: object, name: str, low: int, high: int) -> None:
    """An integer (not a bool) in ``[low, high]``."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not low <= value <= high
    ):
        raise RequestError(
            f"{name}={value!r} must be an integer in [{low}, {high}]", param=name
        )


def check_float(value: object, name: str, low: float, high: float) -> None:
    """A finite number in ``[low, high]``: inf and NaN pass every ``<`` comparison, so
    test them first."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
    ):
        raise RequestError(f"{name}={value!r} must be a finite number", param=name)
    if not low <= value <= high:
        raise RequestError(
            f"{name}={value!r} must be in [{low:g}, {high:g}]", param=name
        )
