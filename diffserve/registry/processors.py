"""Processor classes a pipeline directory may name that transformers builds only with
torchvision.

torchvision has no build beside every torch release (this project's CPU torch has none
on PyPI), so a plain ``from_pretrained(dir)`` without it stops at these components: the
generic path supplies its own stand-ins (``models/generic/vl_processor.py``), and the
test-model builders (``zoo/generic.py``) name them in their marker file so a user knows
what to hand in. One table, read by both.
"""

from __future__ import annotations

from typing import Any

VL_PROCESSOR_CLASS = "Qwen2VLProcessor"
PIXTRAL_PROCESSOR_CLASS = "PixtralProcessor"
QWEN3_VL_PROCESSOR_CLASS = "Qwen3VLProcessor"

# class name -> why transformers needs torchvision to build it.
TORCHVISION_PROCESSORS: dict[str, str] = {
    VL_PROCESSOR_CLASS: "transformers builds "
    "Qwen2VLProcessor with "
    "a Qwen2VLVideoProcessor, "
    "which needs torchvision",
    QWEN3_VL_PROCESSOR_CLASS: "transformers builds Qwen3VLProcessor with a "
    "Qwen3VLVideoProcessor, which needs torchvision",
    PIXTRAL_PROCESSOR_CLASS: "transformers' PixtralProcessor needs torchvision (its "
    "module imports the torchvision "
    "PixtralImageProcessor)",
}


def torchvision_components(index: dict[str, Any]) -> dict[str, str]:
    """The components of a ``model_index.json`` (``index``) whose class transformers
    builds only with torchvision: ``{component: class name}``."""
    return {
        name: entry[-1]
        for name, entry in sorted(index.items())
        if isinstance(entry, list)
        and entry[-1:]
        and entry[-1] in TORCHVISION_PROCESSORS
    }
