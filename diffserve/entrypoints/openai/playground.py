"""The web playground: ``GET /`` and its static files (``static/``), shipped inside the
package.

The page (``static/playground.{html,css,js}``) uses only the public HTTP API, from the
browser. This is plain ASGI middleware placed in front of the API-key check, so the page
itself loads without the key (it asks for it, and sends it on every API call); the Host
allow-list and the metrics still apply. It answers only the paths of ``FILES``, an
in-package allow-list (no path from the request reaches the file system), under a
Content-Security-Policy that allows only this origin, plus ``blob:`` images and media:
the results are shown from the response's bytes (a video's MP4 is fetched with the key,
then played).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, MutableMapping
from importlib import resources
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# path -> (file under static/, media type)
FILES = {
    "/": ("playground.html", "text/html; charset=utf-8"),
    "/static/playground.css": ("playground.css", "text/css; charset=utf-8"),
    "/static/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
    "/static/playground-stream.js": (
        "playground-stream.js",
        "text/javascript; charset=utf-8",
    ),
    "/static/playground-video.js": (
        "playground-video.js",
        "text/javascript; charset=utf-8",
    ),
    "/static/playground-defaults.js": (
        "playground-defaults.js",
        "text/javascript; charset=utf-8",
    ),
    "/static/playground-models.js": (
        "playground-models.js",
        "text/javascript; charset=utf-8",
    ),
    "/static/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' blob:; media-src blob:; "
    "connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-cache"),
)


@functools.cache
def asset(name: str) -> bytes:
    """A static file's bytes, read once on first use (importing this module reads
    nothing)."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


class PlaygroundMiddleware:
    """Serves ``FILES`` for GET and HEAD (405 for other methods); every other path goes
    to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = FILES.get(scope["path"]) if scope["type"] == "http" else None
        if entry is None:
            await self.app(scope, receive, send)
            return
        name, media_type = entry
        if scope["method"] not in ("GET", "HEAD"):
            body = (
                b'{"error": {"message": "method not allowed", '
                b'"type": "invalid_request_error", '
                b'"param": null, "code": "method_not_allowed"}}'
            )
            headers = [
                (b"content-type", b"application/json"),
                (b"allow", b"GET, HEAD"),
                (b"connection", b"close"),
            ]
            status = 405
        else:
            body = asset(name)
            headers = [(b"content-type", media_type.encode()), *SECURITY_HEADERS]
            status = 200
        headers.append((b"content-length", str(len(body)).encode()))
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        await send(
            {
                "type": "http.response.body",
                "body": b"" if scope["method"] == "HEAD" else body,
            }
        )
