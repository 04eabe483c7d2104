"""The HTTP server span: plain ASGI middleware, outermost, so every response (a 401 or
413 too) is traced.

The span's parent is the client's W3C ``traceparent`` (and ``tracestate``) when the
request sent one, so the server's spans join the client's trace; it is current while the
app runs, so admission, the carrier to the workers and the image encode are its
children. Named ``METHOD route`` with the route from a bounded set (``route_of``), never
the raw path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from diffserve.tracing import provider, switch

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TracingMiddleware:
    def __init__(
        self, app: ASGIApp, route_of: Callable[[str], str] = lambda path: "other"
    ) -> None:
        self.app = app
        self.route_of = route_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not switch.ON or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        headers = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope["headers"]
        }
        parent = propagate.extract(headers)
        method, path = scope["method"], scope["path"]
        route = self.route_of(path)
        attributes: dict[str, Any] = {
            "http.request.method": method,
            "url.path": path,
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        if route != "other":
            attributes["http.route"] = route
        if scope.get("client"):
            attributes["client.address"] = scope["client"][0]
        if scope.get("server"):
            attributes["server.port"] = scope["server"][1]
        if "user-agent" in headers:
            attributes["user_agent.original"] = headers["user-agent"][:256]
        span = provider.tracer().start_span(
            f"{method} {route}" if route != "other" else method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
        )
        token = context.attach(trace.set_span_in_context(span, parent))
        status = 0

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            span.end()
            context.detach(token)
