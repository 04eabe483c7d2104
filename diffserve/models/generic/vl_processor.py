"""Qwen2-VL's processor for the image-editing pipelines (Qwen-Image-Edit), with or without torchvision.

``QwenImageEditPipeline`` hands its prompt and input image to a ``Qwen2VLProcessor``: the image processor turns
the image into patches and the tokenizer repeats ``<|image_pad|>`` once per merged patch. transformers builds that
processor with a video processor too, which needs torchvision; where torchvision is not installed (it has no
build beside every torch release) the image-only twin here takes its place: the same image processor (its PIL
backend) and tokenizer from the same directory, the same text and image outputs, no video.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffserve.logging import get_logger

logger = get_logger(__name__)

VL_PROCESSOR_CLASS = "Qwen2VLProcessor"


def load_vl_processor(directory: Path) -> Any:
    """The directory's ``Qwen2VLProcessor``, or its image-only twin where transformers cannot build it."""
    from transformers import Qwen2VLProcessor

    try:
        return Qwen2VLProcessor.from_pretrained(str(directory), local_files_only=True)
    except (AttributeError, ImportError, ValueError) as exc:  # no torchvision: no video processor
        logger.info("Qwen2VLProcessor needs torchvision here (%s); using its image-only twin", exc)
        return image_only_processor(directory)


def image_only_processor(directory: Path) -> Any:
    """A ``Qwen2VLProcessor`` without its video processor, from the image processor and tokenizer files."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        attributes = ["image_processor", "tokenizer"]

        def __init__(self, image_processor: Any, tokenizer: Any) -> None:
            ProcessorMixin.__init__(self, image_processor, tokenizer)
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(str(directory), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    return ImageOnlyQwen2VLProcessor(image_processor, tokenizer)


def vl_processor_components(root: Path) -> dict[str, Any]:
    """``{"processor": ...}`` where ``model_index.json`` names a Qwen2-VL processor, else nothing."""
    import json

    entry = json.loads((root / "model_index.json").read_text(encoding="utf-8")).get("processor")
    if isinstance(entry, list) and entry[-1:] == [VL_PROCESSOR_CLASS]:
        return {"processor": load_vl_processor(root / "processor")}
    return {}
