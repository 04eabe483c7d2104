"""``POST /v1/images/generations``: parse, run on the engine, encode, answer (JSON or
SSE). ``serve`` is also the second half of ``POST /v1/images/edits`` (``edits.py``).

The handler never blocks the event loop: images are encoded in a worker thread. A client
that goes away aborts its request in the engine, so no GPU time is spent on an answer
nobody will read.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from diffserve import __version__
from diffserve.engine.client import AsyncEngineClient
from diffserve.entrypoints.api_errors import APIError, request_id_from, to_api_error
from diffserve.entrypoints.openai.encoding import MIME_TYPES, encode_all
from diffserve.entrypoints.openai.image_events import image_events
from diffserve.entrypoints.openai.image_store import ImageStore
from diffserve.entrypoints.openai.metrics import ServerMetrics
from diffserve.entrypoints.openai.protocol import (
    DiffserveInfo,
    ImageData,
    ImageGenerationRequest,
    ImagesResponse,
    parse_body,
    to_generation_request,
)
from diffserve.entrypoints.openai.served import ServedModel, ServedModels
from diffserve.entrypoints.openai.signing import image_signing
from diffserve.entrypoints.openai.streaming import (
    Events,
    GuardedStream,
    abort_quietly,
    admit,
    aiter_events,
)
from diffserve.errors import RequestAbortedError
from diffserve.logging import get_logger
from diffserve.tracing.attributes import IMAGES, MODEL, OUTPUT_FORMAT, REQUEST_ID
from diffserve.tracing.spans import annotate, span
from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput

logger = get_logger(__name__)

# What the engine yields for one request: progress events, then the output.


class ImagesHandler:
    def __init__(
        self,
        models: ServedModels,
        store: ImageStore,
        metrics: ServerMetrics,
        *,
        max_user_chars: int | None = None,
    ) -> None:
        self.models = models
        self.max_user_chars = max_user_chars
        self.store = store
        self.metrics = metrics

    async def create(self, request: Request) -> Response:
        received = time.perf_counter()
        body = parse_body(await request.body())
        served = self.check_body(body)
        gen = to_generation_request(body, f"img-{uuid.uuid4().hex}")
        return await self.serve(request, body, gen, received, served)

    def check_body(self, body: ImageGenerationRequest) -> ServedModel:
        """The checks of a parsed body that need this server: the model it names (404;
        400 for a video model), ``user``'s length (422). Returns the model that serves
        it."""
        served = self.models.pick(body.model, default_makes="images")
        if served.makes == "videos":
            raise APIError(
                400,
                f"model {served.name!r} makes videos, not images; the "
                "video API (POST /v1/videos) "
                "serves it",
                param="model",
                code="model_makes_videos",
            )
        if (
            body.user is not None
            and self.max_user_chars is not None
            and len(body.user) > self.max_user_chars
        ):
            # `user` only reaches a debug log line, but an unbounded one would still be
            # logged whole.
            raise APIError(
                422,
                f"user has {len(body.user)} characters, above this server's limit of "
                f"{self.max_user_chars}",
                param="user",
                code="limit_exceeded",
            )
        return served

    async def serve(
        self,
        request: Request,
        body: ImageGenerationRequest,
        gen: GenerationRequest,
        received: float,
        served: ServedModel,
    ) -> Response:
        """Run ``gen`` on ``served``'s engine and answer: JSON, or SSE with
        ``body.stream``; a client that goes away aborts it. Shared by generations and
        edits (``received``: when the body arrived, for ``total``)."""
        engine = served.host.require()
        # On the HTTP span, when tracing is on.
        annotate({MODEL: served.name, REQUEST_ID: gen.request_id})
        if body.user:
            logger.debug("request %s from user %r", gen.request_id, body.user)
        events = aiter_events(engine, gen)
        if body.stream:
            first = await admit(engine, gen.request_id, events)
            started = [False]

            async def never_started() -> None:
                first.cancel()
                self.metrics.aborted.inc()
                logger.info(
                    "client went away before the stream started; aborting %s",
                    gen.request_id,
                )
                await abort_quietly(engine, gen.request_id)

            stream = self._sse(
                request, engine, body, gen, events, first, received, started
            )
            return GuardedStream(
                stream,
                started,
                never_started,
                media_type="text/event-stream",
                headers={"X-Request-Id": gen.request_id, "Cache-Control": "no-cache"},
            )
        self.metrics.inflight.inc()
        try:
            output = await self._run_until_disconnect(request, engine, gen, events)
            payload = await self._respond(request, body, gen, output, received)
        finally:
            self.metrics.inflight.dec()
        return JSONResponse(payload, headers={"X-Request-Id": gen.request_id})

    async def _run_until_disconnect(
        self,
        request: Request,
        engine: AsyncEngineClient,
        gen: GenerationRequest,
        events: Events,
    ) -> RequestOutput:
        async def consume() -> RequestOutput:
            async for event in events:
                if isinstance(event, RequestOutput):
                    return event
            raise RequestAbortedError(
                f"request {gen.request_id} ended without an output"
            )

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work = asyncio.create_task(consume())
        watch = asyncio.create_task(disconnected())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                logger.info("client went away; aborting %s", gen.request_id)
                self.metrics.aborted.inc()
                await asyncio.gather(work, return_exceptions=True)
                await abort_quietly(engine, gen.request_id)
        if work.cancelled():
            raise RequestAbortedError(
                f"client disconnected; request {gen.request_id} aborted"
            )
        return work.result()

    async def _respond(
        self,
        request: Request,
        body: ImageGenerationRequest,
        gen: GenerationRequest,
        output: RequestOutput,
        received: float,
    ) -> dict[str, Any]:
        start = time.perf_counter()
        metadata = {
            "prompt": gen.prompt,
            "steps": str(output.num_inference_steps or gen.num_inference_steps),
            "config_fingerprint": output.config_fingerprint,
            "size": f"{output.width}x{output.height}",
            "guidance_scale": str(output.guidance_scale),
            "software": f"diffserve {__version__}",
        }
        if gen.negative_prompt:
            metadata["negative_prompt"] = gen.negative_prompt
        if gen.images:
            metadata["edit"] = (
                f"{len(gen.images)} image(s){', mask' if gen.mask is not None else ''}"
            )
            if gen.strength is not None:
                metadata["strength"] = str(gen.strength)
        with span(
            "diffserve.image_encode",
            {IMAGES: len(output.images), OUTPUT_FORMAT: body.output_format},
        ):
            encoded = await asyncio.to_thread(
                encode_all,
                output.images,
                output.seeds,
                body.output_format,
                body.output_compression,
                metadata,
                image_signing(self.models, body.model, gen, output),
            )
        done = time.perf_counter()
        # Engine phases, plus what the server adds: image encoding and the total it
        # observed (body received -> response ready, so it includes queueing and
        # encoding).
        timings = {
            **{k: float(v) for k, v in output.timings.items()},
            "image_encode": round((done - start) * 1000.0, 3),
            "total": round((done - received) * 1000.0, 3),
        }
        data = []
        for blob in encoded:
            if body.response_format == "url":
                name = self.store.put(
                    blob, MIME_TYPES[body.output_format], body.output_format
                )
                data.append(
                    ImageData(
                        url=str(request.url_for("get_image", name=name)),
                        revised_prompt=output.revised_prompt,
                    )
                )
            else:
                data.append(
                    ImageData(
                        b64_json=base64.b64encode(blob).decode("ascii"),
                        revised_prompt=output.revised_prompt,
                    )
                )
        self.metrics.observe_output(
            timings, len(encoded), output.attestation.get("cache")
        )
        self.metrics.observe_conditioning(dict(output.attestation))
        self.metrics.observe_ar(dict(output.attestation))
        response = ImagesResponse(
            created=int(time.time()),
            data=data,
            output_format=body.output_format,
            size=f"{output.width}x{output.height}",
            diffserve=DiffserveInfo(
                request_id=gen.request_id,
                seeds=list(output.seeds),
                num_inference_steps=output.num_inference_steps
                or gen.num_inference_steps
                or 0,
                timings_ms=timings,
                memory_peak_mib=output.memory_peak_mib,
                attestation=jsonable(output.attestation),
                config_fingerprint=output.config_fingerprint,
            ),
        )
        return response.model_dump(mode="json")

    async def _sse(
        self,
        request: Request,
        engine: AsyncEngineClient,
        body: ImageGenerationRequest,
        gen: GenerationRequest,
        events: Events,
        first: asyncio.Future[ProgressEvent | RequestOutput],
        received: float,
        started: list[bool],
    ) -> AsyncIterator[str]:
        started[0] = True
        finished = False
        shape = image_events(
            gen, body.partial_images, body.output_format, body.output_compression
        )
        self.metrics.inflight.inc()
        try:
            event = await first
            while True:
                if isinstance(event, ProgressEvent):
                    for line in await shape.progress(event):
                        yield line
                elif isinstance(event, RequestOutput):
                    payload = await self._respond(request, body, gen, event, received)
                    finished = True
                    for line in shape.result(payload):
                        yield line
                    return
                event = await events.__anext__()
        except StopAsyncIteration:
            finished = True
            yield shape.error(
                to_api_error(
                    RequestAbortedError(
                        f"request {gen.request_id} ended without an output"
                    )
                ).body()
            )
        except Exception as exc:  # noqa: BLE001 - after the 200 header, errors travel as an event
            finished = True
            yield shape.error(to_api_error(exc, request_id_from(gen.request_id)).body())
        finally:
            self.metrics.inflight.dec()
            first.cancel()  # no-op once done; stops waiting for a request still queued
            if not finished:
                # Client disconnect cancels this generator; the abort must still reach
                # the engine.
                self.metrics.aborted.inc()
                with anyio.CancelScope(shield=True):
                    logger.info("stream closed early; aborting %s", gen.request_id)
                    await abort_quietly(engine, gen.request_id)


def jsonable(value: Any) -> Any:
    """Attestation values come from workers; make sure they serialise (tuples, numpy
    ints, ...)."""
    return json.loads(json.dumps(value, default=str))
