"""Multipart text fields typed by name, strictly, for every form the API takes (``POST
/v1/images/edits``, ``POST /v1/videos``): ``"2"`` is an integer where the body has one,
``"two"`` or ``"2.0"`` a 400 naming the field; floats must parse (``1e400`` becomes inf
and is refused by the body model); booleans are ``true``/``false``; ``loras`` is JSON
text, bounded in nesting before it is parsed. ``""`` is how the SDK sends ``None``:
unset."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from diffserve.entrypoints.openai.protocol import MAX_JSON_DEPTH, nesting_exceeds
from diffserve.errors import RequestError

_INT = re.compile(r"[+-]?\d{1,20}")
_FLOAT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class FieldTypes:
    """Which of a form's fields are integers, numbers and booleans (``loras`` is always
    JSON text)."""

    ints: frozenset[str]
    floats: frozenset[str]
    bools: frozenset[str] = frozenset()

    def typed(self, name: str) -> bool:
        return (
            name in self.ints
            or name in self.floats
            or name in self.bools
            or name == "loras"
        )


def typed_field(name: str, text: str, types: FieldTypes) -> Any:
    """A field's text as the type its name has in the body (None: unset); text fields
    stay text."""
    if not types.typed(name):
        return text
    text = text.strip()
    if not text:
        return None
    if name in types.ints:
        if not _INT.fullmatch(text):
            raise RequestError(f"{name}={text[:50]!r} must be an integer", param=name)
        return int(text)
    if name in types.floats:
        return form_number(text, name, name)
    if name in types.bools:
        if text.lower() not in ("true", "false"):
            raise RequestError(
                f"{name}={text[:50]!r} must be true or false", param=name
            )
        return text.lower() == "true"
    return form_loras(text)


def form_number(text: str, name: str, param: str) -> float:
    if not _FLOAT.fullmatch(text):
        raise RequestError(f"{name}={text[:50]!r} must be a number", param=param)
    # 1e400 is inf here: refused by the model (allow_inf_nan=False), as in JSON.
    return float(text)


def form_loras(text: str) -> Any:
    raw = text.encode()
    if nesting_exceeds(raw, MAX_JSON_DEPTH):
        raise RequestError(
            f"loras nests deeper than {MAX_JSON_DEPTH} levels", param="loras"
        )
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RequestError(
            f'loras must be JSON text like \'[{{"name": "style", "scale": 0.8}}]\': '
            f"{type(exc).__name__}",
            param="loras",
        ) from None
