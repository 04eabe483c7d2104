"""ASGI middleware that runs before any routing or JSON parsing: metrics, Host, API key,
route, body.

They are plain ASGI (not FastAPI dependencies) so a request from the wrong host, without
the key, to a path or method that does not exist, too large, too slow or not JSON is
refused before its body is parsed, and in most of those cases before it is read at all.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from starlette.routing import BaseRoute, Match

from diffserve.entrypoints.api_errors import APIError
from diffserve.entrypoints.openai.hosts import HostAllowList
from diffserve.entrypoints.openai.metrics import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KNOWN_ENDPOINTS = frozenset(
    {
        "/health",
        "/ready",
        "/metrics",
        "/v1/models",
        "/v1/config",
        "/v1/images/generations",
        "/v1/images/edits",
    }
)
IMAGE_FILES_PREFIX = "/v1/images/"
# The only paths served without the API key: probes for load balancers and the scrape
# endpoint. Everything else, unknown paths and image URLs included, needs the key once
# one is set.
PUBLIC_PATHS = frozenset({"/health", "/ready", "/metrics"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def endpoint_label(path: str) -> str:
    """A bounded label set: unknown paths must not create new time series."""
    if path in KNOWN_ENDPOINTS:
        return path
    if path.startswith(IMAGE_FILES_PREFIX):
        return "/v1/images/{name}"
    return "other"


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def is_json_media_type(value: bytes | None) -> bool:
    """``application/json`` or ``application/*+json``, optionally ``; charset=utf-8``.
    Anything else (``text/plain``, form posts) is what a browser may send cross-site
    without a CORS preflight."""
    if value is None:
        return False
    media, _, params = value.decode("latin-1").partition(";")
    media = media.strip().lower()
    if not (
        media == "application/json"
        or (media.startswith("application/") and media.endswith("+json"))
    ):
        return False
    for param in params.split(";"):
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset" and val.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


def is_multipart_media_type(value: bytes | None) -> bool:
    """``multipart/form-data`` (its boundary is the parser's to check)."""
    if value is None:
        return False
    return (
        value.decode("latin-1").partition(";")[0].strip().lower()
        == "multipart/form-data"
    )


async def send_error(send: Send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers().items()]
    await send(
        {"type": "http.response.start", "status": error.status, "headers": headers}
    )
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
            self.metrics.http_requests.labels(
                endpoint=endpoint, status=str(status)
            ).inc()
            self.metrics.http_latency.labels(endpoint=endpoint).observe(
                time.perf_counter() - start
            )


class HostMiddleware:
    """400 ``invalid_host`` unless the Host header is in ``server.allowed_hosts``
    (empty: any)."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = HostAllowList(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = header(scope, b"host")
            if not self.allowed.allows(
                raw.decode("latin-1") if raw is not None else None
            ):
                await send_error(
                    send,
                    APIError(
                        400,
                        "this server does not answer to that Host header "
                        "(server.allowed_hosts)",
                        param="Host",
                        code="invalid_host",
                        headers={"Connection": "close"},
                    ),
                )
                return
        await self.app(scope, receive, send)


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = header(scope, b"authorization") or b""
        # compare_digest: the time taken must not reveal how many leading bytes matched.
        if not hmac.compare_digest(given, self.expected):
            code = "missing_api_key" if not given else "invalid_api_key"
            await send_error(
                send,
                APIError(
                    401,
                    "missing or incorrect API key; send 'Authorization: Bearer <key>'",
                    code=code,
                ),
            )
            return
        await self.app(scope, receive, send)


class RouteGuardMiddleware:
    """404 for unrouted paths and 405 for wrong methods, from the route table, before a
    body is read: a client trickling a large body to a path that does not exist holds
    nothing."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allowed: set[str] = set()
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                await self.app(scope, receive, send)
                return
            if match == Match.PARTIAL:
                allowed.update(getattr(route, "methods", None) or ())
        close = {"Connection": "close"} if scope["method"] in BODY_METHODS else {}
        if allowed:
            await send_error(
                send,
                APIError(
                    405,
                    f"method {scope['method']} is not allowed on {scope['path']}",
                    code="method_not_allowed",
                    headers={"Allow": ", ".join(sorted(allowed)), **close},
                ),
            )
        else:
            await send_error(
                send,
                APIError(
                    404,
                    f"no such endpoint: {scope['path'][:200]}",
                    code="not_found",
                    headers=close,
                ),
            )


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Refuse bodies over ``max_bytes`` (413) from Content-Length, and while reading for
    chunked uploads; refuse a body not complete within ``timeout_s`` (408) and one that
    is not JSON (415); then replay the buffered body to the app. The paths in
    ``uploads`` (``POST /v1/images/edits``) take ``multipart/form-data`` instead of
    JSON, up to their own limit (``server.max_upload_bytes``)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        timeout_s: float = 10.0,
        uploads: dict[str, int] | None = None,
        json_uploads: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.uploads = dict(uploads or {})
        # Upload paths that take a JSON body too (POST /v1/videos: an input_reference as
        # a data URL).
        self.json_uploads = json_uploads

    @staticmethod
    def _too_large(limit: int) -> APIError:
        return APIError(
            413,
            f"request body is larger than this server's limit of {limit} bytes",
            code="body_too_large",
            headers={"Connection": "close"},
        )

    @staticmethod
    def _wrong_type(upload: bool, either: bool = False) -> APIError:
        expected = (
            "multipart/form-data or application/json"
            if either
            else "multipart/form-data"
            if upload
            else "application/json"
        )
        return APIError(
            415,
            f"Content-Type must be {expected}",
            param="Content-Type",
            code="unsupported_media_type",
            headers={"Connection": "close"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        upload = scope["path"] in self.uploads
        limit = self.uploads[scope["path"]] if upload else self.max_bytes
        content_type = header(scope, b"content-type")
        either = scope["path"] in self.json_uploads
        accepted = (is_multipart_media_type(content_type) if upload else False) or (
            (not upload or either) and is_json_media_type(content_type)
        )
        declared = header(scope, b"content-length")
        if declared is not None:
            try:
                too_large = int(declared) > limit
            except ValueError:
                await send_error(
                    send,
                    APIError(
                        400,
                        "invalid Content-Length header",
                        code="invalid_header",
                        headers={"Connection": "close"},
                    ),
                )
                return
            if too_large:
                await send_error(send, self._too_large(limit))
                return
            # Known size: refuse before reading; chunked: after (413 wins there)
            if not accepted:
                await send_error(send, self._wrong_type(upload, either))
                return
        try:
            # The deadline bounds how long a slow (or stalled) client holds a connection
            # and a buffer.
            async with asyncio.timeout(self.timeout_s):
                chunks = await self._read(receive, limit)
        except _BodyTooLarge:
            await send_error(send, self._too_large(limit))
            return
        except TimeoutError:
            await send_error(
                send,
                APIError(
                    408,
                    f"request body not received within {self.timeout_s:g} s",
                    code="body_timeout",
                    headers={"Connection": "close"},
                ),
            )
            return
        if chunks is None:
            return  # the client went away while sending
        if not accepted:
            await send_error(send, self._wrong_type(upload, either))
            return
        # Replayed as received: an upload is not copied into one buffer.
        pending = list(reversed(chunks))

        async def replay() -> Message:
            if pending:
                return {
                    "type": "http.request",
                    "body": pending.pop(),
                    "more_body": bool(pending),
                }
            # After the body, the app only waits here to learn about a client
            # disconnect.
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive, limit: int) -> list[bytes] | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks
