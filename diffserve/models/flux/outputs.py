"""What ``FluxPipeline.run`` yields: one ``StepEvent`` per denoise step, then one ``BatchResult``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # pragma: no cover
    from PIL import Image


@dataclass(frozen=True)
class StepEvent:
    """Denoise step ``step`` (1-based) of ``total_steps`` finished."""

    step: int
    total_steps: int


@dataclass
class ImageResult:
    """One request's output.

    ``images`` is uint8 ``[n, H, W, 3]`` on CPU for output_type "pil", float32 ``[n, 3, H, W]`` in [0, 1]
    for "pt", and the packed latents ``[n, tokens, 64]`` for "latent". ``seeds[i]`` reproduces image i.
    ``timings_ms`` has "encode", "denoise" and "decode" (shared by the requests of one batch).
    """

    request_id: str
    images: torch.Tensor
    seeds: list[int]
    timings_ms: dict[str, float] = field(default_factory=dict)
    output_type: str = "pil"


@dataclass
class BatchResult:
    """The outputs of a batch, in request order."""

    outputs: list[ImageResult]


def to_pil(images: torch.Tensor) -> list[Image.Image]:
    """uint8 ``[n, H, W, 3]`` (the "pil" output) -> PIL images."""
    from PIL import Image

    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"to_pil expects uint8 [n, H, W, 3], got {images.dtype} {tuple(images.shape)}")
    return [Image.fromarray(image.numpy()) for image in images.cpu()]
