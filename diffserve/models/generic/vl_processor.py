"""The processors of the language-model families, with or without torchvision:
Qwen2-VL's for the image-editing pipeline (Qwen-Image-Edit), Qwen3-VL's for
Qwen-Image-2.1 and Pixtral's for FLUX.2-dev's prompts.

``QwenImageEditPipeline`` hands its prompt and input image to a ``Qwen2VLProcessor``:
the image processor turns the image into patches and the tokenizer repeats
``<|image_pad|>`` once per merged patch. transformers builds that processor with a video
processor too, which needs torchvision; where torchvision is not installed (it has no
build beside every torch release) the image-only twin here takes its place: the same
image processor (its PIL backend) and tokenizer from the same directory, the same text
and image outputs, no video. transformers' PixtralProcessor needs torchvision whole;
FLUX.2-dev's text-to-image prompts only use its tokenizer's chat template, so without
torchvision that tokenizer stands in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffserve.logging import get_logger
from diffserve.registry.processors import (
    PIXTRAL_PROCESSOR_CLASS,
    QWEN3_VL_PROCESSOR_CLASS,
    VL_PROCESSOR_CLASS,
)

logger = get_logger(__name__)


def load_vl_processor(directory: Path) -> Any:
    """The directory's ``Qwen2VLProcessor``, or its image-only twin where transformers
    cannot build it."""
    from transformers import Qwen2VLProcessor

    try:
        return Qwen2VLProcessor.from_pretrained(str(directory), local_files_only=True)
    except (
        AttributeError,
        ImportError,
        ValueError,
    ) as exc:  # no torchvision: no video processor
        logger.info(
            "Qwen2VLProcessor needs torchvision here (%s); using its image-only twin",
            exc,
        )
        return image_only_processor(directory)


def image_only_processor(directory: Path) -> Any:
    """A ``Qwen2VLProcessor`` without its video processor, from the image processor and
    tokenizer files."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        attributes = ["image_processor", "tokenizer"]

        def __init__(self, image_processor: Any, tokenizer: Any) -> None:
            ProcessorMixin.__init__(self, image_processor, tokenizer)
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(
        str(directory), local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    return ImageOnlyQwen2VLProcessor(image_processor, tokenizer)


def init_components(root: Path) -> dict[str, Any]:
    """The processors ``model_index.json`` names that the pipeline's ``__init__`` itself
    reads (Qwen-Image-2.1 renders its prompt templates with the Qwen3-VL processor's
    chat template there), so they go in with the load: ``{"processor": ...}``."""
    import json

    index = json.loads((root / "model_index.json").read_text(encoding="utf-8"))
    if _names(index.get("processor"), QWEN3_VL_PROCESSOR_CLASS):
        return {"processor": load_qwen3_vl_processor(root / "processor")}
    return {}


def processor_components(root: Path) -> dict[str, Any]:
    """The processors ``model_index.json`` names that transformers may not build here:
    ``{"processor": ...}`` for a Qwen2-VL processor, ``{"tokenizer": ...}`` for
    FLUX.2-dev's Pixtral processor (its text side, all its text-to-image prompt encoding
    uses, where PixtralProcessor's torchvision is missing)."""
    import json

    index = json.loads((root / "model_index.json").read_text(encoding="utf-8"))
    components: dict[str, Any] = {}
    if _names(index.get("processor"), VL_PROCESSOR_CLASS):
        components["processor"] = load_vl_processor(root / "processor")
    if _names(index.get("tokenizer"), PIXTRAL_PROCESSOR_CLASS):
        components["tokenizer"] = load_pixtral_processor(root / "tokenizer")
    return components


def _names(entry: Any, class_name: str) -> bool:
    return isinstance(entry, list) and entry[-1:] == [class_name]


def load_pixtral_processor(directory: Path) -> Any:
    """The directory's ``PixtralProcessor``, or its tokenizer (with the chat template)
    without torchvision."""
    from transformers import AutoTokenizer

    try:
        from transformers import PixtralProcessor

        return PixtralProcessor.from_pretrained(str(directory), local_files_only=True)
    except ImportError as exc:
        logger.info(
            "PixtralProcessor needs torchvision here (%s); prompts "
            "go through its tokenizer",
            exc,
        )
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def load_qwen3_vl_processor(directory: Path | str) -> Any:
    """The directory's ``Qwen3VLProcessor``, or its image-only twin where transformers
    cannot build it (no torchvision)."""
    from transformers import Qwen3VLProcessor

    try:
        return Qwen3VLProcessor.from_pretrained(str(directory), local_files_only=True)
    except (AttributeError, ImportError, ValueError) as exc:
        logger.info(
            "Qwen3VLProcessor needs torchvision here (%s); using its image-only twin",
            exc,
        )
        return image_only_qwen3_vl_processor(directory)


def image_only_qwen3_vl_processor(directory: Path | str) -> Any:
    """A ``Qwen3VLProcessor`` without its video processor, from the directory's image
    processor (its PIL backend), tokenizer and chat template: the same text and image
    outputs (prompt tokens, ``pixel_values``, ``image_grid_thw``,
    ``mm_token_type_ids``), no video."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen3VLProcessor

    class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
        # ProcessorMixin reads its sub-processors off __init__'s parameters: no
        # video_processor here, and __call__ skips videos without one.
        def __init__(
            self,
            image_processor: Any = None,
            tokenizer: Any = None,
            chat_template: str | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(
                image_processor, tokenizer, None, chat_template=chat_template, **kwargs
            )

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(
        str(directory), local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    return ImageOnlyQwen3VLProcessor(
        image_processor, tokenizer, chat_template=tokenizer.chat_template
    )
