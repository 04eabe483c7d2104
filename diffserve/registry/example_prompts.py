"""A model's example prompts: what its marker file (``diffserve_model.json``) says it
was made to draw.

A model trained on a narrow grammar (the shipped toy models know only "a {colour}
{shape} on a {colour} background") draws noise for a prompt outside it, so the marker
may list prompts it knows, under ``example_prompts``; the playground starts its prompt
box from the first (``/v1/models``'s ``diffserve`` card). The resolver checks the key
(config/sources.py: a wrong type refuses the model); the server reads it here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from diffserve.registry.models import MODEL_MARKER_FILE

EXAMPLE_PROMPTS_KEY = "example_prompts"


def parse_example_prompts(doc: Any) -> tuple[str, ...]:
    """The ``example_prompts`` of a marker document (none declared: ``()``).
    ``ValueError`` when the key holds anything but a list of non-empty strings, naming
    the key and, for a bad item, its index."""
    declared = doc.get(EXAMPLE_PROMPTS_KEY) if isinstance(doc, dict) else None
    if declared is None:
        return ()
    if not isinstance(declared, list):
        raise ValueError(
            f"{EXAMPLE_PROMPTS_KEY} must be a list of prompts, got "
            f"{type(declared).__name__}"
        )
    for index, prompt in enumerate(declared):
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(
                f"{EXAMPLE_PROMPTS_KEY}[{index}] must be a non-empty "
                f"string, got {prompt!r}"
            )
    return tuple(declared)


@functools.lru_cache(maxsize=64)
def model_example_prompts(model_dir: str | None) -> tuple[str, ...]:
    """The example prompts a (local) model directory's marker declares; ``()`` without a
    marker or examples. Cached: /v1/models asks on every call, and a served directory's
    marker does not change under it. A marker that cannot be read or is wrong also gives
    ``()``: resolving the config already refused such a model, so this only meets one
    changed on disk since, and an example prompt is not worth failing the model list
    for."""
    if not model_dir:
        return ()
    try:
        doc = json.loads(
            (Path(model_dir) / MODEL_MARKER_FILE).read_text(encoding="utf-8")
        )
        return parse_example_prompts(doc)
    except (OSError, ValueError):
        return ()
