"""One mapper from an API's fields to the engine's ``GenerationRequest``, for every API:
the images and videos bodies (``openai/``), a stored job's row (``jobs/``) and
``diffserve generate``'s arguments. A field is named as the request names it; ``None``
means unset (admission gives the engine's default); ``size`` is the Images API's
``"WIDTHxHEIGHT"``. Kept free of pydantic so ``generate`` does not import it (about 0.05
s and 8 MiB of its cold start)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from diffserve.errors import RequestError
from diffserve.types.request import GenerationRequest

# What a client may ask: every field of the request but what the engine adds.
CLIENT_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerationRequest)) - {
    "carried"
}

_SIZE_RE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def parse_size(size: str | None) -> tuple[int | None, int | None]:
    """``"WxH"`` -> ``(width, height)``; ``None`` or ``"auto"`` -> the model's default
    size."""
    if size is None or size == "auto":
        return None, None
    match = _SIZE_RE.match(size)
    if not match:
        raise RequestError(
            f"size={size!r} must look like 'WIDTHxHEIGHT', e.g. '512x512'", param="size"
        )
    width, height = int(match.group(1)), int(match.group(2))
    for value in (width, height):
        if value < 16 or value % 16:
            raise RequestError(
                f"size={size!r}: width and height must be positive multiples of 16",
                param="size",
            )
    return width, height


def to_request(fields: Mapping[str, Any], **given: Any) -> GenerationRequest:
    """The engine request of ``fields`` and ``given`` (``given`` wins): the client
    fields that are set, the ``size`` string as ``width``/``height``, ``loras`` as
    ``(name, scale)`` pairs (or objects with ``name`` and ``scale``); other names (an
    API's own: ``model``, ``response_format``, ...) are not the engine's. Building it
    checks every field (``RequestError``: HTTP 400)."""
    values = {**fields, **given}
    kwargs = {
        name: value
        for name, value in values.items()
        if name in CLIENT_FIELDS and value is not None
    }
    if values.get("size") is not None:
        width, height = parse_size(values["size"])
        kwargs.update(
            {
                name: value
                for name, value in (("width", width), ("height", height))
                if value is not None
            }
        )
    if "loras" in kwargs:
        kwargs["loras"] = tuple(_lora_pair(choice) for choice in kwargs["loras"])
    return GenerationRequest(**kwargs)


def _lora_pair(choice: Any) -> Any:
    if hasattr(choice, "name") and hasattr(choice, "scale"):
        return choice.name, choice.scale
    if isinstance(choice, Iterable) and not isinstance(choice, str):
        return tuple(choice)
    return choice  # GenerationRequest names what is wrong with it
