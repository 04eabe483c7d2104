"""The server-sent events of a streamed image request, in one of two shapes.

* ``ProgressEvents`` (a request without ``partial_images``): one ``progress`` event per
  denoise step, the response object as ``result``, then ``[DONE]`` (docs/api.md).
* ``OpenAIImageEvents`` (a request with ``partial_images``): OpenAI's streaming images
  shape, which the official SDK parses: ``image_generation.partial_image`` (edits:
  ``image_edit.partial_image``) with ``b64_json`` and ``partial_image_index`` for each
  preview the engine decoded, then one ``.completed`` event per image carrying the same
  bytes as the non-streamed response, and diffserve's object on each.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any, Protocol

from diffserve.entrypoints.openai.encoding import encode_image
from diffserve.entrypoints.openai.streaming import sse
from diffserve.types.request import GenerationRequest, ProgressEvent

# OpenAI's event fields that have no meaning for a diffusion model.
QUALITY, BACKGROUND = "auto", "auto"
ZERO_USAGE = {
    "total_tokens": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    "input_tokens_details": {"text_tokens": 0, "image_tokens": 0},
}


class ImageEvents(Protocol):
    """How a stream writes the engine's events."""

    async def progress(self, event: ProgressEvent) -> list[str]: ...
    def result(self, payload: dict[str, Any]) -> list[str]: ...
    def error(self, body: dict[str, Any]) -> str: ...


class ProgressEvents:
    """diffserve's own shape: progress per step, then the response as ``result``."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id

    async def progress(self, event: ProgressEvent) -> list[str]:
        if event.preview is not None:
            return []
        return [
            sse(
                {
                    "type": "progress",
                    "request_id": self.request_id,
                    "step": event.step,
                    "total_steps": event.total_steps,
                }
            )
        ]

    def result(self, payload: dict[str, Any]) -> list[str]:
        return [sse({"type": "result", **payload}), "data: [DONE]\n\n"]

    def error(self, body: dict[str, Any]) -> str:
        return sse({"type": "error", **body})


class OpenAIImageEvents:
    """OpenAI's shape: partial images, then each image's ``completed`` event."""

    def __init__(
        self, gen: GenerationRequest, output_format: str, compression: int | None
    ) -> None:
        self.kind = "image_edit" if gen.images else "image_generation"
        self.output_format = output_format
        self.compression = compression

    async def progress(self, event: ProgressEvent) -> list[str]:
        if event.preview is None:
            return []  # OpenAI's shape has no step events
        images = event.preview.numpy()
        blobs = await asyncio.to_thread(self._encode, images)
        height, width = images.shape[1:3]
        name = f"{self.kind}.partial_image"
        return [
            sse(
                {
                    "type": name,
                    "b64_json": base64.b64encode(blob).decode("ascii"),
                    "created_at": int(time.time()),
                    "size": f"{width}x{height}",
                    "quality": QUALITY,
                    "background": BACKGROUND,
                    "output_format": self.output_format,
                    "partial_image_index": event.preview_index,
                    "image_index": index,
                },
                name,
            )
            for index, blob in enumerate(blobs)
        ]

    def _encode(self, images: Any) -> list[bytes]:
        from PIL import Image

        return [
            encode_image(
                Image.fromarray(image), self.output_format, compression=self.compression
            )
            for image in images
        ]

    def result(self, payload: dict[str, Any]) -> list[str]:
        name = f"{self.kind}.completed"
        return [
            sse(
                {
                    "type": name,
                    "b64_json": item["b64_json"],
                    "created_at": payload["created"],
                    "size": payload["size"],
                    "quality": QUALITY,
                    "background": BACKGROUND,
                    "output_format": payload["output_format"],
                    "usage": ZERO_USAGE,
                    "image_index": index,
                    "revised_prompt": item.get("revised_prompt"),
                    "diffserve": payload["diffserve"],
                },
                name,
            )
            for index, item in enumerate(payload["data"])
        ]

    def error(self, body: dict[str, Any]) -> str:
        return sse({"type": "error", **body}, "error")


def image_events(
    gen: GenerationRequest,
    partial_images: int | None,
    output_format: str,
    compression: int | None,
) -> ImageEvents:
    """The shape a streamed request asked for: OpenAI's when it names
    ``partial_images`` (0 included), diffserve's progress events otherwise."""
    if partial_images is None:
        return ProgressEvents(gen.request_id)
    return OpenAIImageEvents(gen, output_format, compression)
