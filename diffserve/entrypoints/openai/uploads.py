"""Decode the input images and the mask of an edit (``POST /v1/images/edits``,
``diffserve generate --image``) into the engine's arrays, refusing anything that is not
a small PNG, JPEG or WEBP before it is decoded.

Each file is opened lazily: Pillow reads only the header, so the format and the declared
size are checked (against ``max_pixels`` and ``MAX_SIDE``) before a single pixel is
decompressed, and a decompression bomb costs nothing. The mask's declared size must
equal the first image's, also from the headers. Only then are the files decoded. Every
refusal is a ``RequestError`` (HTTP 400) with ``param`` ``image`` or ``mask`` and code
``invalid_image``.

Mask convention (HTTP and CLI alike): a mask with an alpha channel follows OpenAI, fully
transparent pixels (alpha 0) are edited; a mask without one (grayscale or RGB) follows
diffusers, white (>= 128) is edited. Either way the engine gets uint8 [H, W] with 255 =
repaint and 0 = keep.

CPU work: the server runs :func:`decode_edit_inputs` in a worker thread. Pillow and
numpy are imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import io
from typing import Any

from diffserve.errors import RequestError

ACCEPTED_FORMATS = ("PNG", "JPEG", "WEBP")
# Pillow names a JPEG carrying a multi-picture (MPO) index, as phone cameras write,
# "MPO": it is a JPEG.
_FORMAT_ALIASES = {"MPO": "JPEG"}
MAX_SIDE = 8192  # pixels per side of an input image or mask
INVALID_IMAGE = "invalid_image"
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})


def input_pixel_limit(max_pixels: int) -> int:
    """Most pixels of an uploaded image: four times the largest output
    (``server.max_pixels``), so an input somewhat larger than the output is still
    accepted (the engine resizes it)."""
    return 4 * max_pixels


def open_image(
    data: bytes,
    param: str,
    *,
    max_pixels: int,
    max_side: int = MAX_SIDE,
    label: str | None = None,
) -> Any:
    """A lazily opened PIL image whose header says PNG/JPEG/WEBP of at most
    ``max_pixels`` pixels and ``max_side`` per side. Nothing is decoded yet. Raises
    ``RequestError(param=param)``; ``label`` names the file in the message (default:
    ``param``)."""
    import warnings

    from PIL import Image

    label = label or param
    if not data:
        raise RequestError(f"{label} is an empty file", param=param, code=INVALID_IMAGE)
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb guard warns (then raises) far above our bound; the
            # warning is a refusal too.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise RequestError(
            f"{label} declares too many pixels ({exc})", param=param, code=INVALID_IMAGE
        ) from None
    except Image.UnidentifiedImageError:
        raise RequestError(
            f"{label} is not a PNG, JPEG or WEBP image", param=param, code=INVALID_IMAGE
        ) from None
    except Exception as exc:  # noqa: BLE001 - whatever a parser raises on hostile bytes is the client's error
        raise RequestError(
            f"{label} has an unreadable header: {type(exc).__name__}: {str(exc)[:200]}",
            param=param,
            code=INVALID_IMAGE,
        ) from None
    fmt = _FORMAT_ALIASES.get(image.format or "", image.format)
    # The formats filter already ensures this; kept as a guard.
    if fmt not in ACCEPTED_FORMATS:
        image.close()
        raise RequestError(
            f"{label} is {image.format}; send PNG, JPEG or WEBP",
            param=param,
            code=INVALID_IMAGE,
        )
    width, height = image.size
    if (
        width < 1
        or height < 1
        or max(width, height) > max_side
        or width * height > max_pixels
    ):
        image.close()
        raise RequestError(
            f"{label} is {width}x{height}; at most {max_side} pixels "
            f"per side and {max_pixels} "
            "pixels in all",
            param=param,
            code=INVALID_IMAGE,
        )
    return image


def has_alpha(image: Any) -> bool:
    """Whether the (still undecoded) image has an alpha channel or a transparent palette
    entry or color."""
    return image.mode in _ALPHA_MODES or "transparency" in image.info


def _load(image: Any, param: str, label: str) -> None:
    try:
        image.load()
    except Exception as exc:  # noqa: BLE001 - a corrupt or truncated file, whatever the decoder raises
        raise RequestError(
            f"{label} could not be decoded: {type(exc).__name__}: {str(exc)[:200]}",
            param=param,
            code=INVALID_IMAGE,
        ) from None


def to_rgb_array(image: Any, param: str = "image", label: str | None = None) -> Any:
    """Decode to uint8 [H, W, 3] RGB. An alpha channel is dropped (the colors stay as
    stored)."""
    import numpy as np

    label = label or param
    _load(image, param, label)
    try:
        if image.mode != "RGB":
            image = image.convert("RGBA" if has_alpha(image) else "RGB").convert("RGB")
        return np.array(image, dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - an exotic mode Pillow cannot convert
        raise RequestError(
            f"{label} could not be converted to RGB: {type(exc).__name__}",
            param=param,
            code=INVALID_IMAGE,
        ) from None


def to_mask_array(image: Any, param: str = "mask", label: str | None = None) -> Any:
    """Decode to uint8 [H, W] with 255 = repaint, 0 = keep: with alpha, alpha 0 is
    repainted (OpenAI); without, white (>= 128) is repainted (diffusers binarizes its
    masks at 0.5 the same way)."""
    import numpy as np

    label = label or param
    alpha = has_alpha(image)
    _load(image, param, label)
    try:
        if alpha:
            values = np.array(image.convert("RGBA").getchannel("A"), dtype=np.uint8)
            return np.where(values == 0, 255, 0).astype(np.uint8)
        values = np.array(image.convert("L"), dtype=np.uint8)
        return np.where(values >= 128, 255, 0).astype(np.uint8)
    except Exception as exc:  # noqa: BLE001 - an exotic mode Pillow cannot convert
        raise RequestError(
            f"{label} could not be converted: {type(exc).__name__}",
            param=param,
            code=INVALID_IMAGE,
        ) from None


def decode_edit_inputs(
    images: list[bytes],
    mask: bytes | None,
    *,
    max_pixels: int,
    max_side: int = MAX_SIDE,
    labels: list[str] | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """The images as uint8 RGB arrays and the mask (or None) as uint8 [H, W], 255 =
    repaint.

    Every header is checked (format, declared size, the mask's size against the first
    image's) before anything is decoded. ``labels``: how messages name the images, then
    the mask (default ``image``, or ``image 2 of 3``, and ``mask``)."""
    if labels is None:
        labels = (
            ["image"]
            if len(images) == 1
            else [f"image {i + 1} of {len(images)}" for i in range(len(images))]
        )
        labels.append("mask")
    opened: list[Any] = []
    try:
        for data, label in zip(images, labels, strict=False):
            opened.append(
                open_image(
                    data, "image", max_pixels=max_pixels, max_side=max_side, label=label
                )
            )
        mask_image = None
        if mask is not None:
            if not opened:
                raise RequestError(
                    "a mask needs an image to edit", param="mask", code=INVALID_IMAGE
                )
            mask_image = open_image(
                mask, "mask", max_pixels=max_pixels, max_side=max_side, label=labels[-1]
            )
            opened.append(mask_image)
            if mask_image.size != opened[0].size:
                (mw, mh), (w, h) = mask_image.size, opened[0].size
                raise RequestError(
                    f"{labels[-1]} is {mw}x{mh}; it must be the size of "
                    f"the first image, {w}x{h}",
                    param="mask",
                    code=INVALID_IMAGE,
                )
        arrays = tuple(
            to_rgb_array(image, "image", label)
            for image, label in zip(opened[: len(images)], labels, strict=False)
        )
        mask_array = (
            to_mask_array(mask_image, "mask", labels[-1])
            if mask_image is not None
            else None
        )
        return arrays, mask_array
    finally:
        for image in opened:
            image.close()


def read_edit_files(
    image_paths: list[str], mask_path: str | None, *, max_pixels: int
) -> tuple[tuple[Any, ...], Any]:
    """``diffserve generate --image ... [--mask ...]``: the same checks and conversions
    on local files."""

    def read(path: str, param: str) -> bytes:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise RequestError(
                f"--{param} {path}: {exc.strerror or exc}", param=param
            ) from None

    return decode_edit_inputs(
        [read(path, "image") for path in image_paths],
        read(mask_path, "mask") if mask_path else None,
        max_pixels=max_pixels,
        labels=[*(f"--image {p}" for p in image_paths), f"--mask {mask_path}"],
    )
