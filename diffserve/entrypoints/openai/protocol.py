"""The HTTP API's request and response models (OpenAI's images API plus diffserve
extensions).

Parsing is strict: unknown fields, wrong types and out-of-range values are errors naming
the field, never silently ignored or coerced (``"2"`` is not ``2``).
:func:`to_generation_request` turns a parsed body into the engine's
``GenerationRequest``; the limits the *deployment* sets (``server.max_n`` ...) are
checked by the engine at admission (``engine/admission.py``) and answered with 422.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from diffserve.entrypoints.request_fields import to_request
from diffserve.errors import RequestError
from diffserve.types.attestation import Attestation
from diffserve.types.request import GenerationRequest
from diffserve.types.request_checks import (
    MAX_CACHE_THRESHOLD,
    MAX_GUIDANCE_SCALE,
    MAX_PARTIAL_IMAGES,
    MAX_SEED,
    MAX_TRUE_CFG_SCALE,
)

OutputFormat = Literal["png", "jpeg", "webp"]
ResponseFormat = Literal["b64_json", "url"]

# OpenAI parameters the SDK may send that have no meaning for a diffusion server. They
# are refused with a clear message instead of being accepted and ignored.
UNSUPPORTED_OPENAI_PARAMS = frozenset(
    {
        "background",
        "moderation",
        "quality",
        "style",
        "complexity",
        "frame_count",
        "frame_duration_ms",
        "svg",
    }
)

# No valid body nests deeper than 2; the bound keeps hostile nesting away from recursive
# code.
MAX_JSON_DEPTH = 32


class LoraChoice(BaseModel):
    """One adapter of ``loras``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=1024)
    scale: float = 1.0


class ImageGenerationRequest(BaseModel):
    """Body of ``POST /v1/images/generations``."""

    # allow_inf_nan=False: 1e400 parses as inf and NaN/Infinity literals as floats;
    # neither is a value.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    prompt: str = Field(min_length=1)
    model: str | None = None
    n: int = Field(default=1, ge=1)
    size: str | None = None
    response_format: ResponseFormat = "b64_json"
    output_format: OutputFormat = "png"
    output_compression: int | None = Field(default=None, ge=0, le=100)
    user: str | None = None
    # diffserve extensions (the SDK sends them through ``extra_body``).
    negative_prompt: str | None = None
    num_inference_steps: int | None = Field(default=None, ge=1)
    guidance_scale: float | None = Field(default=None, ge=0, le=MAX_GUIDANCE_SCALE)
    true_cfg_scale: float | None = Field(default=None, ge=0, le=MAX_TRUE_CFG_SCALE)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    # Text tokens per prompt (1..512); short prompts run much faster with a small
    # window.
    max_sequence_length: int | None = None
    # Step-cache threshold (higher = more steps skipped, 0 = no caching); unset: the
    # deployment's.
    cache_threshold: float | None = Field(default=None, ge=0, le=MAX_CACHE_THRESHOLD)
    # LoRA adapters: [{"name": registered name or path inside lora_dir, "scale":
    # float}]; empty = base model.
    loras: list[LoraChoice] | None = Field(default=None, max_length=16)
    # false: encode this request's prompts afresh and keep them out of the conditioning
    # cache.
    conditioning_cache: bool | None = None
    # false: skip the deployment's AR stages (kind: ar) and draw from the prompt as
    # written; unset: rewrite it.
    rewrite_prompt: bool | None = None
    stream: bool = False
    # With ``stream``: OpenAI's streaming shape, with this many partial images (0..3)
    # decoded from the running latents before each image's ``completed`` event.
    partial_images: int | None = Field(default=None, ge=0, le=MAX_PARTIAL_IMAGES)


class ImageEditRequest(ImageGenerationRequest):
    """The fields of ``POST /v1/images/edits`` (multipart; ``edits.py`` types the form's
    text, the files travel apart): the generation fields plus ``strength``."""

    # The fraction of the noise schedule that runs, from the input image noised to that
    # level (1.0 = from pure noise); unset: the engine's default (0.6).
    strength: float | None = Field(default=None, gt=0, le=1)


def parse_body(raw: bytes) -> ImageGenerationRequest:
    """Parse a raw JSON body. Raises ``RequestError`` (HTTP 400) naming the first bad
    field."""
    if nesting_exceeds(raw, MAX_JSON_DEPTH):
        raise RequestError(
            f"request body nests deeper than {MAX_JSON_DEPTH} levels",
            param=None,
            code="invalid_json",
        )
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: the C parser recurses per nesting level (kept as a second line
        # of defence).
        raise RequestError(
            f"request body is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}",
            param=None,
            code="invalid_json",
        ) from exc
    if not isinstance(data, dict):
        raise RequestError(
            "request body must be a JSON object", param=None, code="invalid_json"
        )
    unsupported = sorted(UNSUPPORTED_OPENAI_PARAMS & data.keys())
    if unsupported:
        raise RequestError(
            f"parameter {unsupported[0]!r} is not supported by this "
            "server: its diffusion models "
            "have no such setting",
            param=unsupported[0],
            code="unsupported_parameter",
        )
    try:
        return ImageGenerationRequest.model_validate(data)
    except ValidationError as exc:
        raise request_error(exc) from exc


_OPENERS = frozenset(b"[{")
_CLOSERS = frozenset(b"]}")


def nesting_exceeds(raw: bytes, limit: int) -> bool:
    """Whether brackets outside strings nest deeper than ``limit``: one linear pass,
    before the parser ever recurses. Malformed input is left to ``json.loads`` to
    report."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        # Not enough brackets to exceed the limit (the common case, no scan)
        return False
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in _OPENERS:
            depth += 1
            if depth > limit:
                return True
        elif byte in _CLOSERS:
            depth -= 1
    return False


def request_error(exc: ValidationError) -> RequestError:
    err = exc.errors(include_url=False)[0]
    param = ".".join(str(p) for p in err.get("loc", ())) or None
    if err.get("type") == "extra_forbidden":
        return RequestError(
            f"unknown parameter {param!r}", param=param, code="unknown_parameter"
        )
    if err.get("type") == "missing":
        return RequestError(
            f"missing required parameter {param!r}",
            param=param,
            code="missing_parameter",
        )
    got = err.get("input")
    shown = (
        json.dumps(got)
        if isinstance(got, (str, int, float, bool, type(None)))
        else type(got).__name__
    )
    return RequestError(
        f"{param}={shown}: {err.get('msg', 'invalid value')}",
        param=param,
        code="invalid_value",
    )


def to_generation_request(
    body: ImageGenerationRequest,
    request_id: str,
    *,
    images: tuple[Any, ...] = (),
    mask: Any = None,
) -> GenerationRequest:
    """The body's engine request (``request_fields.to_request``: its construction checks
    the fields, HTTP 400). The deployment's limits (422) and the model's capabilities
    are checked once, and unset fields filled with the deployment's defaults, at engine
    admission. ``images``/``mask``: an edit's decoded inputs (``uploads.py``); ``size``
    stays unset without one, so admission takes the first image's size."""
    if body.partial_images is not None and not body.stream:
        raise RequestError(
            "partial_images streams its images: send stream: true with it",
            param="partial_images",
        )
    if body.partial_images is not None and body.response_format != "b64_json":
        raise RequestError(
            "a stream with partial_images sends b64_json images; leave "
            "response_format unset",
            param="response_format",
        )
    given: dict[str, Any] = {"request_id": request_id}
    if images:
        given.update(images=tuple(images), mask=mask)
    return to_request(dict(body), **given)


class ImageData(BaseModel):
    b64_json: str | None = None
    url: str | None = None
    revised_prompt: str | None = None


class DiffserveInfo(BaseModel):
    """What ran: the seed of every image, per-phase timings, kernel attestation, config
    fingerprint."""

    request_id: str
    seeds: list[int]
    num_inference_steps: int
    timings_ms: dict[str, float]
    # The device's peak memory during each engine phase (encode, denoise, decode), MiB:
    # on CPU the process's peak resident set, on CUDA the allocator's peak.
    memory_peak_mib: dict[str, float] = {}
    attestation: Attestation
    config_fingerprint: str


class ImagesResponse(BaseModel):
    created: int
    data: list[ImageData]
    output_format: OutputFormat
    size: str
    diffserve: DiffserveInfo


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
