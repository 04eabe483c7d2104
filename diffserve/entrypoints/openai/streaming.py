"""Streaming an image request: the engine's events as an async iterator (``Events``), a
server-sent event line, and the response that still aborts its request when a client
left before the stream began."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi.responses import StreamingResponse

from diffserve.engine.client import AsyncEngineClient
from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput

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


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
