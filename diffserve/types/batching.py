"""The batch keys: the contracts that decide which requests may share a forward.

- ``batch_key``: a request-level batch (``batching: request``, the generic path) runs
  requests with equal keys only: same latent shape, schedule, guidance, true-CFG mode,
  text length, output type, step-cache threshold and adapters.
- ``step_key``: a step-level batch of a native runner (``batching: step``) mixes what
  the runner carries per request: steps (each request its own schedule), step-cache
  threshold (each its own cache slot), LoRA adapters (each row its own deltas) and the
  shape, rows of one ``group_key`` (size, frames, edit inputs) sharing each transformer
  call and the groups of other shapes running back to back within the step. What stays
  in ``step_key`` is what every row of the batch must share (guidance, CFG branches,
  text window, output type).

Anything that makes two requests' forwards differ belongs in these keys, nowhere else.
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


class StepKey(NamedTuple):
    """What every request of one step-level batch shares (see the module docstring)."""

    guidance_scale: float | None
    true_cfg_scale: float
    has_negative_prompt: bool
    max_sequence_length: int | None
    output_type: str
    is_warmup: bool
    edits: bool  # edit requests never share a batch with plain ones


class GroupKey(NamedTuple):
    """The rows of one transformer call inside a step-level batch: one latent shape
    (and one edit kind, whose inputs join the rows; an edit with a strength starts
    part-way through its schedule, so those of one group share their steps)."""

    height: int | None
    width: int | None
    num_frames: int | None
    edit: tuple[tuple[tuple[int, ...], ...], bool, float | None] | None = None
    edit_steps: int | None = None


def step_key(request: GenerationRequest) -> StepKey:
    guidance = None if request.guidance_scale is None else float(request.guidance_scale)
    return StepKey(
        guidance,
        float(request.true_cfg_scale),
        request.negative_prompt is not None,
        request.max_sequence_length,
        request.output_type,
        request.is_warmup,
        bool(request.images),
    )


def group_key(request: GenerationRequest) -> GroupKey:
    edit = _edit_key(request)
    return GroupKey(
        request.height,
        request.width,
        request.num_frames,
        edit,
        # Where the schedule starts depends on the strength and the steps: rows of one
        # group start at one step.
        request.num_inference_steps if request.strength is not None else None,
    )


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
