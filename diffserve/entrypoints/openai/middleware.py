"""ASGI middleware that runs before any routing or JSON parsing: metrics, API key, body size.

They are plain ASGI (not FastAPI dependencies) so an unauthenticated or oversized request is refused
before its body is read or parsed.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from diffserve.entrypoints.openai.errors import APIError
from diffserve.entrypoints.openai.metrics import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KNOWN_ENDPOINTS = frozenset({"/health", "/ready", "/metrics", "/v1/models", "/v1/config",
                             "/v1/images/generations"})
IMAGE_FILES_PREFIX = "/v1/images/"


def endpoint_label(path: str) -> str:
    """A bounded label set: unknown paths must not create new time series."""
    if path in KNOWN_ENDPOINTS:
        return path
    if path.startswith(IMAGE_FILES_PREFIX):
        return "/v1/images/{name}"
    return "other"


def is_public(path: str) -> bool:
    """Probes and metrics stay open for load balancers and scrapers; image URLs are capabilities
    (128 random bits) that browsers must be able to fetch without a header."""
    if not path.startswith("/v1/"):
        return True
    return path.startswith(IMAGE_FILES_PREFIX) and path != "/v1/images/generations"


async def send_error(send: Send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class MetricsMiddleware:
    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            endpoint = endpoint_label(scope["path"])
            self.metrics.http_requests.labels(endpoint=endpoint, status=str(status)).inc()
            self.metrics.http_latency.labels(endpoint=endpoint).observe(time.perf_counter() - start)


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        # compare_digest: the time taken must not reveal how many leading bytes matched.
        if not hmac.compare_digest(given, self.expected):
            code = "missing_api_key" if not given else "invalid_api_key"
            await send_error(send, APIError(401, "missing or incorrect API key; send 'Authorization: Bearer "
                                                 "<key>'", code=code))
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse bodies over ``max_bytes`` (413) from Content-Length, and while reading for chunked
    uploads, then replay the buffered body to the app."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> APIError:
        return APIError(413, f"request body is larger than this server's limit of {self.max_bytes} bytes",
                        code="body_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_bytes
            except ValueError:
                await send_error(send, APIError(400, "invalid Content-Length header", code="invalid_header"))
                return
            if too_large:
                await send_error(send, self._too_large())
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await send_error(send, self._too_large())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            # After the body, the app only waits here to learn about a client disconnect.
            return await receive()

        await self.app(scope, replay, send)
