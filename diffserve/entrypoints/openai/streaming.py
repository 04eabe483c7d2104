"""Streaming an image request: the engine's events as an async iterator (``Events``), a
server-sent event line, and the response that still aborts its request when a client
left before the stream began."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi.responses import StreamingResponse

from diffserve.engine.client import AsyncEngineClient
from diffserve.errors import RequestAbortedError
from diffserve.logging import get_logger
from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput

logger = get_logger(__name__)

# What one request's engine run yields: its progress events, then its output.
Events = AsyncIterator[ProgressEvent | RequestOutput]


class GuardedStream(StreamingResponse):
    """A stream that still aborts its request when the body generator never ran.

    A client that disconnects before the response starts cancels the stream before the
    generator's first step, so the generator's own cleanup (the abort) never runs, and a
    queued request would then run to completion for nobody. ``started[0]`` is set by the
    generator's first line."""

    def __init__(
        self,
        content: AsyncIterator[str],
        started: list[bool],
        on_never_started: Callable[[], Awaitable[None]],
        **kwargs: Any,
    ) -> None:
        super().__init__(content, **kwargs)
        self.started = started
        self.on_never_started = on_never_started

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.started[0]:
                with anyio.CancelScope(shield=True):
                    await self.on_never_started()


def aiter_events(engine: AsyncEngineClient, gen: GenerationRequest) -> Events:
    return engine.generate(gen).__aiter__()


def sse(obj: dict[str, Any], event: str | None = None) -> str:
    """One server-sent event (named when ``event`` is given)."""
    data = json.dumps(obj, separators=(",", ":"))
    return f"event: {event}\ndata: {data}\n\n" if event else f"data: {data}\n\n"


async def admit(
    engine: AsyncEngineClient, request_id: str, events: Events
) -> asyncio.Future[ProgressEvent | RequestOutput]:
    """Submit the request and return the future of its first event.

    The engine admits (validates, enqueues) synchronously inside the first
    ``__anext__``, before it waits for an event: one loop turn is enough to raise
    admission errors here, so they keep their HTTP status (400, 429, 503), while a
    queued stream gets its 200 header at once instead of after the wait.
    """
    first = asyncio.ensure_future(anext_or_abort(engine, request_id, events))
    await asyncio.sleep(0)
    if first.done():
        first.result()  # raises the admission error, if any
    return first


async def anext_or_abort(
    engine: AsyncEngineClient, request_id: str, events: Events
) -> ProgressEvent | RequestOutput:
    try:
        return await events.__anext__()
    except StopAsyncIteration as exc:
        raise RequestAbortedError(
            f"request {request_id} ended without an output"
        ) from exc


async def abort_quietly(engine: AsyncEngineClient, request_id: str) -> None:
    try:
        await engine.abort(request_id)
    except Exception as exc:  # noqa: BLE001 - a failed abort must not mask the original outcome
        logger.warning("abort of %s failed: %s", request_id, exc)
