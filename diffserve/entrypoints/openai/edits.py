"""``POST /v1/images/edits``: OpenAI's multipart edit request, typed as strictly as the
JSON generations.

The form is parsed with bounded counts and sizes (the whole body is bounded before, by
``server.max_upload_bytes`` in ``middleware.py``). Text fields are typed by name
(``"2"`` is an int for ``n``, ``"0.6"`` a float for ``strength``; ``"two"`` is a 400
naming the field), then validated by the same pydantic model as the generations body, so
every field keeps its bounds. The files' headers are checked before anything is decoded
(``uploads.py``), decoding runs in a worker thread, and the request then takes the
generations path (``ImagesHandler.serve``): the same JSON or SSE answer, abort on
disconnect, metadata and attestation.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from diffserve.entrypoints.api_errors import APIError
from diffserve.entrypoints.openai.form_fields import (
    FieldTypes,
    form_number,
    typed_field,
)
from diffserve.entrypoints.openai.images import ImagesHandler
from diffserve.entrypoints.openai.protocol import (
    UNSUPPORTED_OPENAI_PARAMS,
    ImageEditRequest,
    request_error,
    to_generation_request,
)
from diffserve.entrypoints.openai.uploads import decode_edit_inputs, input_pixel_limit
from diffserve.errors import RequestError
from diffserve.types.request_checks import MAX_INPUT_IMAGES

EDITS_PATH = "/v1/images/edits"
# The SDK sends one image as ``image`` and a list as ``image[]`` (one part per file).
IMAGE_FIELDS = frozenset({"image", "image[]"})
UNSUPPORTED_EDIT_PARAMS = UNSUPPORTED_OPENAI_PARAMS | {"input_fidelity", "markup"}
INT_FIELDS = frozenset(
    {
        "n",
        "output_compression",
        "num_inference_steps",
        "seed",
        "max_sequence_length",
        "partial_images",
    }
)
FLOAT_FIELDS = frozenset(
    {"guidance_scale", "true_cfg_scale", "cache_threshold", "strength"}
)
BOOL_FIELDS = frozenset({"stream", "conditioning_cache", "rewrite_prompt"})
TYPES = FieldTypes(ints=INT_FIELDS, floats=FLOAT_FIELDS, bools=BOOL_FIELDS)
# ``loras`` as JSON text, or as the SDK flattens ``extra_body={"loras": [{"name",
# "scale"}]}``.
LORA_NAME, LORA_SCALE = "loras[][name]", "loras[][scale]"
MAX_TEXT_FIELDS = 64


class EditsHandler:
    def __init__(
        self, images: ImagesHandler, *, max_pixels: int, max_field_bytes: int = 65536
    ) -> None:
        self.images = images
        self.max_input_pixels = input_pixel_limit(max_pixels)
        self.max_field_bytes = max_field_bytes

    async def create(self, request: Request) -> Response:
        received = time.perf_counter()
        try:
            # One file beyond the limits is still parsed, so "too many images" is our
            # 400 naming `image`.
            async with request.form(
                max_files=MAX_INPUT_IMAGES + 2,
                max_fields=MAX_TEXT_FIELDS,
                max_part_size=self.max_field_bytes,
            ) as form:
                body, files, mask = parse_form(form.multi_items())
                served = self.images.check_body(body)
                served.host.require()  # not ready or dead: 503 before any decoding
                blobs = [await upload.read() for upload in files]
                mask_blob = await mask.read() if mask is not None else None
        except (
            StarletteHTTPException
        ) as exc:  # a malformed multipart body (Starlette's parser)
            detail = str(exc.detail)
            param = "image" if "files" in detail.lower() else None
            raise APIError(
                400,
                f"invalid multipart/form-data body: {detail}",
                param=param,
                code="invalid_value" if param else "invalid_multipart",
            ) from None
        images, mask_array = await asyncio.to_thread(
            decode_edit_inputs, blobs, mask_blob, max_pixels=self.max_input_pixels
        )
        gen = to_generation_request(
            body, f"img-{uuid.uuid4().hex}", images=images, mask=mask_array
        )
        return await self.images.serve(request, body, gen, received, served)


def parse_form(
    items: list[tuple[str, Any]],
) -> tuple[ImageEditRequest, list[UploadFile], UploadFile | None]:
    """The typed body, the image files in order and the mask file, from the form's
    ``(name, value)`` pairs. Raises ``RequestError`` (400) naming the field."""
    texts: dict[str, str] = {}
    images: list[UploadFile] = []
    mask: UploadFile | None = None
    lora_parts: list[tuple[str, str]] = []
    for name, value in items:
        is_file = isinstance(value, UploadFile)
        if name in UNSUPPORTED_EDIT_PARAMS:
            raise RequestError(
                f"parameter {name!r} is not supported by this server: "
                "its diffusion models have no "
                "such setting",
                param=name,
                code="unsupported_parameter",
            )
        if name in IMAGE_FIELDS or name == "mask":
            param = "mask" if name == "mask" else "image"
            if not is_file:
                raise RequestError(
                    f"{name} must be a file part (with a filename), not a text field",
                    param=param,
                )
            if name == "mask":
                if mask is not None:
                    raise RequestError("mask given twice; send one mask", param="mask")
                mask = value
            elif len(images) >= MAX_INPUT_IMAGES:
                raise RequestError(
                    f"more than {MAX_INPUT_IMAGES} images; send at most "
                    f"{MAX_INPUT_IMAGES}",
                    param="image",
                )
            else:
                images.append(value)
            continue
        if is_file:
            raise RequestError(f"{name} must be a text field, not a file", param=name)
        if name in (LORA_NAME, LORA_SCALE):
            lora_parts.append((name, value))
            continue
        if name in texts:
            raise RequestError(f"{name} given twice", param=name)
        texts[name] = value
    if not images:
        raise RequestError(
            "missing required file 'image' (send it as 'image', "
            "or several as 'image[]')",
            param="image",
            code="missing_parameter",
        )
    data: dict[str, Any] = {}
    for name, text in texts.items():
        typed = typed_field(name, text, TYPES)
        if typed is not None or not TYPES.typed(name):
            data[name] = typed
    if lora_parts:
        if "loras" in data:
            raise RequestError(
                "loras given twice (as JSON text and as loras[][name] fields)",
                param="loras",
            )
        data["loras"] = _bracket_loras(lora_parts)
    try:
        return ImageEditRequest.model_validate(data), images, mask
    except ValidationError as exc:
        raise request_error(exc) from exc


def _bracket_loras(parts: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """``loras[][name]=a, loras[][scale]=0.8, loras[][name]=b, ...`` -> ``[{"name": "a",
    "scale": 0.8}, ...]``: each name starts an adapter, a scale belongs to the name
    before it."""
    loras: list[dict[str, Any]] = []
    for key, value in parts:
        if key == LORA_NAME:
            loras.append({"name": value})
        elif not loras or "scale" in loras[-1]:
            raise RequestError(
                "loras[][scale] must follow its loras[][name]", param="loras"
            )
        else:
            loras[-1]["scale"] = form_number(value.strip(), LORA_SCALE, "loras")
    return loras
