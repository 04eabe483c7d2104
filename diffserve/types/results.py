"""What a pipeline run yields (one ``StepEvent`` per denoise step, then one
``BatchResult``) and the per-request ``RequestResult`` that travels unchanged from the
pipeline through the worker to the engine.

One result type end to end: the pipeline fills images, seeds and timings, the worker
adds the batch's attestation, the channel moves it, and the engine materialises it into
the user's ``RequestOutput``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diffserve.types.attestation import Attestation

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from PIL import Image


@dataclass(frozen=True)
class StepEvent:
    """Denoise step ``step`` (1-based) of ``total_steps`` finished. In a step-level
    batch the requests may be at different steps: ``progress`` then holds ``(request_id,
    steps done)`` of each (``step`` is the furthest one); empty means every request is
    at ``step``."""

    step: int
    total_steps: int
    progress: tuple[tuple[str, int], ...] = ()
    # Partial images decoded after this step (``GenerationRequest.partial_images``).
    previews: tuple[Preview, ...] = ()


@dataclass(frozen=True)
class Preview:
    """Request ``request_id``'s partial image number ``index`` (0-based): its running
    latents decoded, uint8 ``[n, H, W, 3]`` on CPU (one per image of the request)."""

    request_id: str
    index: int
    images: torch.Tensor


@dataclass
class RequestResult:
    """One request's images.

    ``images`` is uint8 ``[n, H, W, 3]`` on CPU for output_type "pil", float32 ``[n, 3,
    H, W]`` in [0, 1] for "pt", and the packed latents ``[n, tokens, 64]`` for "latent".
    ``seeds[i]`` reproduces image i. ``timings_ms`` has "encode", "denoise" and "decode"
    (shared by the requests of one batch), and ``memory_peak_mib`` the peak memory of
    the device during each of them (``models/memory.py``). ``attestation`` (added by the
    worker) says what actually ran for the batch this request was part of.
    """

    request_id: str
    images: torch.Tensor
    seeds: list[int]
    timings_ms: dict[str, float] = field(default_factory=dict)
    memory_peak_mib: dict[str, float] = field(default_factory=dict)
    attestation: Attestation = field(default_factory=Attestation)
    # What the next stage of a staged topology takes from this one (the family's own
    # connector payload, carried opaque); None from the last stage.
    handoff: Any = None
    # A model that makes sound (LTX-2): each video's waveform, float32 numpy ``[n,
    # channels, samples]`` in [-1, 1] at ``audio_sample_rate`` Hz; None otherwise.
    audio: Any = None
    audio_sample_rate: int = 0


@dataclass
class BatchResult:
    """Results in request order: the requests of a batch that finished at this step (a
    step-level batch yields one whenever requests finish; a plain batch yields one,
    last)."""

    outputs: list[RequestResult]


def to_pil(images: torch.Tensor) -> list[Image.Image]:
    """uint8 ``[n, H, W, 3]`` (the "pil" output) -> PIL images."""
    import numpy as np
    import torch
    from PIL import Image

    if (
        images.dtype != torch.uint8
        or images.ndim != 4
        or images.shape[-1] not in (3, 4)
    ):
        raise ValueError(
            f"to_pil expects uint8 [n, H, W, 3] (or 4: RGBA), got {images.dtype} "
            f"{tuple(images.shape)}"
        )
    # numpy makes any copy (single-threaded): a torch copy on the engine's thread would
    # start a second OpenMP team in the process, which slows every op of a uni worker
    # (docs/engine.md, "One compute thread").
    array = images.detach().cpu().numpy()
    return [
        Image.fromarray(np.ascontiguousarray(array[i])) for i in range(array.shape[0])
    ]
