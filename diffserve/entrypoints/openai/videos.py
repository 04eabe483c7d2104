"""``/v1/videos``: OpenAI's video job API over the job store (``entrypoints/jobs``).

``POST`` checks the request against the engine the way an image request is checked at
admission (so a bad one is a 400/422 now, not a failed job later), fixes its seed and
defaults, stores it and answers with the queued job; the runner claims and runs it.
Every other route reads or changes the store only, so any instance that shares the store
answers for any job. Store calls block: each runs in a worker thread, bounded by the
store's timeout.
"""

from __future__ import annotations

import asyncio
import io
import re
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from diffserve.entrypoints.api_errors import APIError
from diffserve.entrypoints.jobs.artifacts import INPUT, JOB_ID, VARIANTS, ArtifactDir
from diffserve.entrypoints.jobs.job_request import to_row
from diffserve.entrypoints.jobs.runner import JobRunner
from diffserve.entrypoints.jobs.store import COMPLETED, IdempotencyConflict, JobStore
from diffserve.entrypoints.openai.list_query import check_names, fetch_page, list_page
from diffserve.entrypoints.openai.served import ServedModels
from diffserve.entrypoints.openai.uploads import (
    input_pixel_limit,
    open_image,
    to_rgb_array,
)
from diffserve.entrypoints.openai.video_protocol import (
    MAX_TEXT_FIELDS,
    VideoCreateRequest,
    parse_form,
    parse_json,
    request_hash,
    video_object,
)
from diffserve.entrypoints.request_fields import to_request
from diffserve.entrypoints.webhooks.setup import Webhooks
from diffserve.entrypoints.webhooks.urls import WebhookURLError
from diffserve.errors import RequestError
from diffserve.tracing.attributes import MODEL, VIDEO_JOB
from diffserve.tracing.spans import annotate
from diffserve.types.request import GenerationRequest

VIDEOS_PATH = "/v1/videos"
MEDIA_TYPES = {
    "video": "video/mp4",
    "thumbnail": "image/webp",
    "spritesheet": "image/jpeg",
}
_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,256}")


class VideosHandler:
    def __init__(
        self,
        models: ServedModels,
        store: JobStore,
        artifacts: ArtifactDir,
        runner: JobRunner,
        *,
        max_pixels: int,
        max_field_bytes: int,
        webhooks: Webhooks | None = None,
    ) -> None:
        self.models = models
        self.store = store
        self.artifacts = artifacts
        self.runner = runner
        self.webhooks = webhooks
        self.max_input_pixels = input_pixel_limit(max_pixels)
        self.max_field_bytes = max_field_bytes

    async def start(self) -> None:
        await self.runner.start()
        if self.webhooks is not None:
            await self.webhooks.start()

    async def stop(self) -> None:
        # Deliveries first: the runner's stop closes the store they use.
        if self.webhooks is not None:
            await self.webhooks.stop()
        await self.runner.stop()

    # -- create
    # ----------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        key = request.headers.get("idempotency-key")
        if key is not None and not _IDEMPOTENCY_KEY.fullmatch(key):
            raise APIError(
                400,
                "Idempotency-Key must be 1-256 printable ASCII characters",
                param="Idempotency-Key",
                code="invalid_value",
            )
        body, image_bytes = await self._read_body(request)
        served = self.models.pick(body.model, default_makes="videos")
        if served.makes != "videos":
            raise APIError(
                400,
                f"model {served.name!r} makes images; POST /v1/images/generations "
                "serves it",
                param="model",
                code="model_makes_images",
            )
        engine = served.host.require()
        image = None
        if image_bytes is not None:
            image = await asyncio.to_thread(self._decode_reference, image_bytes)
        admitted = self._admit(engine, body, image)
        seconds = (
            body.seconds.strip()
            if body.seconds is not None
            else f"{(admitted.num_frames or 0) / max(1, admitted.fps or 1):g}"
        )
        fields = to_row(admitted, seconds=seconds, has_input=image is not None)
        if body.webhook_url is not None:
            await self._check_webhook_url(body.webhook_url)
            fields["webhook_url"] = body.webhook_url
        try:
            job, created = await asyncio.to_thread(
                self.store.create,
                model=served.name,
                prompt=body.prompt,
                request=fields,
                now=time.time(),
                idempotency_key=key,
                request_hash=request_hash(body, image_bytes),
            )
        except IdempotencyConflict as exc:
            raise APIError(
                409, str(exc), param="Idempotency-Key", code="idempotency_conflict"
            ) from None
        if created and image is not None:
            try:
                await asyncio.to_thread(
                    self.artifacts.publish, job.id, INPUT, lambda p: _save_png(p, image)
                )
            except OSError:
                # No job without its input.
                await asyncio.to_thread(self.store.delete, job.id)
                raise
        # On the HTTP span; the job runs in a trace of its own.
        annotate({MODEL: served.name, VIDEO_JOB: job.id})
        if created:
            self.runner.notify()
        return JSONResponse(video_object(job), headers={"X-Request-Id": job.id})

    async def _read_body(
        self, request: Request
    ) -> tuple[VideoCreateRequest, bytes | None]:
        if "multipart/form-data" not in request.headers.get("content-type", "").lower():
            return parse_json(await request.body())
        try:
            async with request.form(
                max_files=2,
                max_fields=MAX_TEXT_FIELDS,
                max_part_size=self.max_field_bytes,
            ) as form:
                body, upload = parse_form(form.multi_items())
                return body, (await upload.read() if upload is not None else None)
        except StarletteHTTPException as exc:
            raise APIError(
                400,
                f"invalid multipart/form-data body: {exc.detail}",
                code="invalid_multipart",
            ) from None

    async def _check_webhook_url(self, url: str) -> None:
        """A 400 for a ``webhook_url`` this server will not call (webhooks/urls.py)."""
        try:
            if self.webhooks is None:
                raise WebhookURLError(
                    "this server accepts no webhook_url (server.webhooks is not set)"
                )
            await asyncio.to_thread(self.webhooks.check_url, url)
        except WebhookURLError as exc:
            raise APIError(
                400, str(exc), param="webhook_url", code="invalid_webhook_url"
            ) from None

    def _decode_reference(self, data: bytes) -> Any:
        image = open_image(data, "input_reference", max_pixels=self.max_input_pixels)
        return to_rgb_array(image, "input_reference")

    def _admit(
        self, engine: Any, body: VideoCreateRequest, image: Any
    ) -> GenerationRequest:
        """The engine's admission of this body, once (400/422 as for images): what the
        job stores and runs. ``seconds`` becomes frames at the fps that will run
        (``types/modality.py``)."""
        request = to_request(
            dict(body),
            seconds=body.seconds_value(),
            request_id=f"check-{uuid.uuid4().hex}",
            images=(image,) if image is not None else None,
        )
        return engine.admit(request)

    # -- read
    # ----------------------------------------------------------------------------------

    async def retrieve(self, video_id: str) -> Response:
        video = video_object(await self._job(video_id))
        if self.webhooks is not None:
            # Delivery state of the job's events (docs/webhooks.md), where configured.
            events = await asyncio.to_thread(self.webhooks.for_job, video_id)
            video["webhooks"] = [event.public() for event in events]
        return JSONResponse(video)

    async def list(self, request: Request) -> Response:
        query = request.query_params
        check_names(query, {"after", "limit", "order"})
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise RequestError(
                f"order={order[:20]!r} must be asc or desc", param="order"
            )
        jobs, more = await fetch_page(
            query, self.store.page, id_pattern=JOB_ID, noun="video", order=order
        )
        return JSONResponse(list_page([video_object(job) for job in jobs], more))

    async def content(self, video_id: str, request: Request) -> Response:
        variant = request.query_params.get("variant", "video")
        if variant not in VARIANTS:
            raise RequestError(
                f"variant={variant[:40]!r} must be one of {', '.join(VARIANTS)}",
                param="variant",
            )
        job = await self._job(video_id)
        expired = job.expires_at is not None and job.expires_at <= time.time()
        if job.status != COMPLETED or expired:
            state = "expired" if expired else job.status
            raise APIError(
                404,
                f"video {video_id} has no content ({state}); it is downloadable "
                "once completed "
                "and until it expires",
                param="video_id",
                code="video_not_ready"
                if not expired and job.status != "failed"
                else "video_not_found",
            )
        try:
            data = await asyncio.to_thread(
                self.artifacts.path(video_id, variant).read_bytes
            )
        except FileNotFoundError:  # deleted or expired since the row was read
            raise APIError(
                404,
                f"video {video_id} was deleted",
                param="video_id",
                code="video_not_found",
            ) from None
        name = f"{video_id}{_suffix(variant)}"
        return Response(
            data,
            media_type=MEDIA_TYPES[variant],
            headers={"Content-Disposition": f'inline; filename="{name}"'},
        )

    # -- delete
    # ----------------------------------------------------------------------------------

    async def delete(self, video_id: str) -> Response:
        await self._job(video_id)
        # Running here: aborted at its next step, its slot freed.
        await self.runner.cancel(video_id)
        deleted = await asyncio.to_thread(self.store.delete, video_id)
        # Row first, files second: the job is gone for every instance before its files
        # go (a crash between them leaves files without a row, which the runner's sweep
        # removes). Elsewhere, its runner sees the lease gone at its next heartbeat and
        # aborts.
        await asyncio.to_thread(self.artifacts.remove, video_id)
        if not deleted:
            raise _not_found(video_id)
        return JSONResponse(
            {"id": video_id, "object": "video.deleted", "deleted": True}
        )

    async def _job(self, video_id: str) -> Any:
        if not JOB_ID.fullmatch(video_id):
            raise _not_found(video_id)
        job = await asyncio.to_thread(self.store.get, video_id)
        if job is None:
            raise _not_found(video_id)
        return job


def _not_found(video_id: str) -> APIError:
    return APIError(
        404,
        f"no video {video_id[:80]!r} (deleted, expired or never created)",
        param="video_id",
        code="video_not_found",
    )


def _suffix(variant: str) -> str:
    return VARIANTS[variant]


def _save_png(path: Any, image: Any) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    path.write_bytes(buffer.getvalue())
