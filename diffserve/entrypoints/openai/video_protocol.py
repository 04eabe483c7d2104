"""``POST /v1/videos``'s body (OpenAI's Videos API plus diffserve's extensions), JSON or
multipart, typed as strictly as the images API: unknown fields, wrong types and
out-of-range values are 400s naming the field; and the video object every route answers
with.

The SDK (``client.videos.create``) always sends multipart: its text fields are typed by
name here (``"4"`` is a number for ``seconds``, ``"3"`` an integer for ``seed``);
``input_reference`` is a file part there, and ``{"image_url":
"data:image/png;base64,..."}`` in JSON.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from diffserve.entrypoints.jobs.store import COMPLETED, FAILED, Job
from diffserve.entrypoints.openai.form_fields import FieldTypes, typed_field
from diffserve.entrypoints.openai.protocol import (
    MAX_JSON_DEPTH,
    LoraChoice,
    nesting_exceeds,
    request_error,
)
from diffserve.errors import RequestError
from diffserve.types.request_checks import (
    MAX_CACHE_THRESHOLD,
    MAX_GUIDANCE_SCALE,
    MAX_SEED,
)

MAX_SECONDS = 600.0
TYPES = FieldTypes(
    ints=frozenset({"seed", "num_inference_steps", "fps", "num_frames"}),
    floats=frozenset({"guidance_scale", "cache_threshold"}),
    bools=frozenset({"rewrite_prompt"}),
)
MAX_TEXT_FIELDS = 32


class InputReference(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    image_url: str = Field(min_length=1)


class VideoCreateRequest(BaseModel):
    """Body of ``POST /v1/videos``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    prompt: str = Field(min_length=1)
    model: str | None = None
    # OpenAI's: a string ("4"); any positive number of seconds here.
    seconds: str | None = None
    size: str | None = None
    # JSON only; multipart sends a file part.
    input_reference: InputReference | None = None
    # diffserve extensions
    negative_prompt: str | None = None
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    num_inference_steps: int | None = Field(default=None, ge=1)
    guidance_scale: float | None = Field(default=None, ge=0, le=MAX_GUIDANCE_SCALE)
    fps: int | None = Field(default=None, ge=1)
    num_frames: int | None = Field(default=None, ge=1)  # overrides seconds
    cache_threshold: float | None = Field(default=None, ge=0, le=MAX_CACHE_THRESHOLD)
    loras: list[LoraChoice] | None = Field(default=None, max_length=16)
    # false: skip the deployment's AR stages (kind: ar) and draw from the prompt as
    # written; unset: rewrite it.
    rewrite_prompt: bool | None = None
    # where this job's events are POSTed too (a host in server.webhooks.allowed_hosts;
    # docs/webhooks.md)
    webhook_url: str | None = Field(default=None, min_length=1, max_length=2048)

    def seconds_value(self) -> float | None:
        """``seconds`` as a number, or a 400 naming it."""
        if self.seconds is None:
            return None
        try:
            value = float(self.seconds.strip())
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0 or value > MAX_SECONDS:
            raise RequestError(
                f"seconds={self.seconds[:50]!r} must be a positive number "
                "of seconds up to "
                f"{MAX_SECONDS:g}",
                param="seconds",
            )
        return value


def parse_json(raw: bytes) -> tuple[VideoCreateRequest, bytes | None]:
    """A JSON body and its ``input_reference`` image bytes (from the data URL), or a
    400."""
    if nesting_exceeds(raw, MAX_JSON_DEPTH):
        raise RequestError(
            f"request body nests deeper than {MAX_JSON_DEPTH} levels",
            code="invalid_json",
        )
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(
            f"request body is not valid JSON: {type(exc).__name__}", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise RequestError("request body must be a JSON object", code="invalid_json")
    if isinstance(data.get("seconds"), (int, float)) and not isinstance(
        data.get("seconds"), bool
    ):
        data["seconds"] = str(data["seconds"])  # 4 and "4" alike
    body = _validate(data)
    image = (
        _data_url(body.input_reference.image_url)
        if body.input_reference is not None
        else None
    )
    return body, image


def parse_form(
    items: list[tuple[str, Any]],
) -> tuple[VideoCreateRequest, UploadFile | None]:
    """A multipart body's typed fields and its ``input_reference`` file part, or a
    400."""
    texts: dict[str, Any] = {}
    reference: UploadFile | None = None
    for name, value in items:
        if name == "input_reference":
            if not isinstance(value, UploadFile):
                raise RequestError(
                    "input_reference must be a file part (an image), not a text field",
                    param="input_reference",
                )
            if reference is not None:
                raise RequestError(
                    "input_reference given twice", param="input_reference"
                )
            reference = value
            continue
        if isinstance(value, UploadFile):
            raise RequestError(f"{name} must be a text field, not a file", param=name)
        if name in texts:
            raise RequestError(f"{name} given twice", param=name)
        texts[name] = typed_field(name, value, TYPES)
    return _validate({k: v for k, v in texts.items() if v is not None}), reference


def _validate(data: dict[str, Any]) -> VideoCreateRequest:
    try:
        return VideoCreateRequest.model_validate(data)
    except ValidationError as exc:
        raise request_error(exc) from exc


def _data_url(url: str) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL (no fetching: a URL to elsewhere is
    refused)."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise RequestError(
            "input_reference.image_url must be a data URL (data:image/png;base64,...); "
            "this server "
            "fetches nothing",
            param="input_reference",
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(
            "input_reference.image_url is not valid base64", param="input_reference"
        ) from None


def request_hash(body: VideoCreateRequest, image: bytes | None) -> str:
    """What an ``Idempotency-Key`` is bound to: the body's fields and the image's
    bytes."""
    digest = hashlib.sha256(
        json.dumps(
            body.model_dump(mode="json", exclude={"input_reference"}), sort_keys=True
        ).encode()
    )
    digest.update(hashlib.sha256(image or b"").digest())
    return digest.hexdigest()


def video_object(job: Job) -> dict[str, Any]:
    """The OpenAI video object of a job, with diffserve's ``diffserve`` block (what ran,
    once it ran)."""
    request, result = job.request, job.result or {}
    error = (
        {"code": job.error_code, "message": job.error_message}
        if job.status == FAILED
        else None
    )
    info: dict[str, Any] = {
        "seed": request.get("seed"),
        "num_inference_steps": request.get("num_inference_steps"),
        "num_frames": request.get("num_frames"),
        "fps": request.get("fps"),
        "guidance_scale": request.get("guidance_scale"),
    }
    # The instance that runs it (its lease holder) or ran it: with several instances on
    # one store, which one.
    info["instance"] = result.get("instance") if job.status == COMPLETED else job.owner
    if job.status == COMPLETED:
        info.update(
            {
                k: result[k]
                for k in ("attestation", "config_fingerprint", "timings_ms")
                if k in result
            }
        )
    return {
        "id": job.id,
        "object": "video",
        "model": job.model,
        "prompt": job.prompt,
        "revised_prompt": result.get("revised_prompt"),
        "status": job.status,
        "progress": job.progress,
        "created_at": int(job.created_at),
        "completed_at": int(job.completed_at) if job.completed_at is not None else None,
        "expires_at": int(job.expires_at) if job.expires_at is not None else None,
        "size": f"{request.get('width')}x{request.get('height')}",
        "seconds": request.get("seconds"),
        "remixed_from_video_id": None,
        "error": error,
        "diffserve": info,
    }
