"""A job's engine request as a database row holds it: the admitted
``GenerationRequest``'s fields as JSON (seed and defaults already filled, so a job run
again after a restart makes the same video), the input image kept apart as a file
(``ArtifactDir``'s ``input`` variant)."""

from __future__ import annotations

from typing import Any

from diffserve.entrypoints.request_fields import to_request
from diffserve.types.request import GenerationRequest

# The fields that make a video; everything else of a GenerationRequest is per-run
# (request id) or absent here.
STORED_FIELDS = (
    "prompt",
    "negative_prompt",
    "height",
    "width",
    "num_inference_steps",
    "guidance_scale",
    "true_cfg_scale",
    "seed",
    "max_sequence_length",
    "cache_threshold",
    "num_frames",
    "fps",
    "conditioning_cache",
    "rewrite_prompt",
)


def to_row(
    request: GenerationRequest, *, seconds: str, has_input: bool
) -> dict[str, Any]:
    """The admitted request as JSON-able fields, with the clip length the client sees
    and whether an ``input_reference`` image was stored."""
    fields: dict[str, Any] = {name: getattr(request, name) for name in STORED_FIELDS}
    fields["loras"] = [[name, scale] for name, scale in request.loras]
    fields["seconds"] = seconds
    fields["has_input"] = has_input
    return fields


def from_row(
    fields: dict[str, Any], request_id: str, image: Any = None
) -> GenerationRequest:
    """The engine request of a stored job, as admitted when the job was created
    (``image``: the decoded ``input_reference``, when it has one): the engine runs it
    without admitting it again."""
    stored = {
        name: fields[name] for name in (*STORED_FIELDS, "loras") if name in fields
    }
    request = to_request(
        stored, request_id=request_id, images=(image,) if image is not None else None
    )
    return request.carrying(admitted=True)
