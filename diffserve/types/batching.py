"""The batch key: the one contract that decides which requests may share a forward.

The scheduler batches only requests with equal keys, and a pipeline may assume (and
checks) that every batch it runs has one key: same latent shape, schedule, guidance,
true-CFG mode, text length and output type, step-cache threshold. Anything that makes
two requests' forwards differ belongs in this key, nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from diffserve.types.request import GenerationRequest


class BatchKey(NamedTuple):
    height: int | None
    width: int | None
    num_inference_steps: int | None  # None only before admission fills the defaults
    guidance_scale: float | None
    true_cfg_scale: float
    has_negative_prompt: bool
    max_sequence_length: int | None
    output_type: str
    is_warmup: bool
    cache_threshold: float | None  # rows of one batch share the step cache's threshold
    # One adapter set per batch: every row gets the same deltas.
    loras: tuple[tuple[str, float], ...] = ()
    # Edits: the input images' sizes, whether a mask is given, the strength (one edit
    # kind per batch).
    edit: tuple[tuple[tuple[int, ...], ...], bool, float | None] | None = None
    num_frames: int | None = None  # video models: one clip length per batch


def batch_key(request: GenerationRequest) -> BatchKey:
    guidance = None if request.guidance_scale is None else float(request.guidance_scale)
    return BatchKey(
        request.height,
        request.width,
        request.num_inference_steps,
        guidance,
        float(request.true_cfg_scale),
        request.negative_prompt is not None,
        request.max_sequence_length,
        request.output_type,
        request.is_warmup,
        None if request.cache_threshold is None else float(request.cache_threshold),
        request.loras,
        _edit_key(request),
        request.num_frames,
    )


@dataclass(frozen=True)
class BatchPlan:
    """What every request of an admitted batch shares, typed for the pipeline that runs
    it (a request's fields stay optional until admission fills them; a pipeline only
    ever runs admitted requests)."""

    height: int
    width: int
    steps: int
    guidance_scale: float
    text_length: int  # max_sequence_length
    cache_threshold: float = 0.0  # the step cache's (0: uncached)
    num_frames: int | None = None  # video: frames of every clip


def plan_of(request: GenerationRequest) -> BatchPlan:
    """The plan of ``request``'s batch; ``ValueError`` for a request that admission did
    not complete (engine admission or ``models.base.library_admit`` fill every
    field)."""
    fields = (
        request.height,
        request.width,
        request.num_inference_steps,
        request.guidance_scale,
        request.max_sequence_length,
        request.cache_threshold,
    )
    height, width, steps, guidance, length, threshold = fields
    if (
        height is None
        or width is None
        or steps is None
        or guidance is None
        or length is None
        or threshold is None
    ):
        raise ValueError(
            f"request {request.request_id} was not admitted: size, "
            "num_inference_steps, "
            "guidance_scale, max_sequence_length and cache_threshold "
            "must be set (engine admission or "
            "models.base.library_admit fills them)"
        )
    return BatchPlan(
        height,
        width,
        steps,
        float(guidance),
        length,
        float(threshold),
        request.num_frames,
    )


def _edit_key(
    request: GenerationRequest,
) -> tuple[tuple[tuple[int, ...], ...], bool, float | None] | None:
    if not request.images:
        return None
    return (
        tuple(tuple(image.shape) for image in request.images),
        request.mask is not None,
        None if request.strength is None else float(request.strength),
    )
