"""The API's error contract: diffserve exceptions -> HTTP statuses and OpenAI-shaped
error bodies.

Every error the server returns is ``{"error": {"message", "type", "param", "code"}}`` so
the official SDK raises its typed exception (BadRequestError, AuthenticationError, ...)
with our message. Shared by the HTTP routes (``openai/``) and the job runner
(``jobs/runner.py``: a failed video job's error reads as the same body), so it lives
beside both rather than in either.
"""

from __future__ import annotations

import re
import uuid

from diffserve.errors import (
    EngineDeadError,
    EngineNotReadyError,
    EngineOverloadedError,
    LimitExceededError,
    RequestAbortedError,
    RequestError,
    StageUnavailableError,
)
from diffserve.logging import get_logger

logger = get_logger(__name__)

# Seconds a client should wait before retrying a 429/503.
RETRY_AFTER_S = 1


class APIError(Exception):
    """An error already decided at the HTTP layer (auth, unknown model, body too
    large)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.extra_headers = dict(headers or {})
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, dict[str, str | None]]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        if self.status in (429, 503):
            return {"Retry-After": str(RETRY_AFTER_S), **self.extra_headers}
        if self.status == 401:
            return {"WWW-Authenticate": "Bearer", **self.extra_headers}
        return dict(self.extra_headers)


# A client's X-Request-Id is echoed into logs and bodies only if it is short and plain.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def request_id_from(header: str | None) -> str:
    """The client's ``X-Request-Id`` when it is safe to log and echo, else a fresh
    one."""
    if header and _REQUEST_ID.match(header):
        return header
    return f"req-{uuid.uuid4().hex}"


def to_api_error(exc: BaseException, request_id: str | None = None) -> APIError:
    """The HTTP error for an exception raised while serving a request.

    An unexpected exception is logged with its traceback under ``request_id``; the body
    carries only that id, never the exception text (it may hold paths, config values or
    library internals)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, LimitExceededError):
        return APIError(422, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, EngineOverloadedError):
        return APIError(
            429,
            str(exc) or "request queue is full; retry later",
            type="rate_limit_error",
            code="queue_full",
        )
    if isinstance(exc, EngineNotReadyError):
        return APIError(
            503,
            str(exc) or "the model is still loading",
            type="server_error",
            code="engine_not_ready",
        )
    if isinstance(exc, StageUnavailableError):
        return APIError(503, str(exc), type="server_error", code="stage_unavailable")
    if isinstance(exc, EngineDeadError):
        return APIError(
            503,
            str(exc) or "the engine is dead; restart the server",
            type="server_error",
            code="engine_dead",
        )
    if isinstance(exc, RequestAbortedError):
        # 499 is nginx's "client closed request": only visible in logs and metrics.
        return APIError(
            499,
            str(exc) or "request aborted",
            type="invalid_request_error",
            code="aborted",
        )
    request_id = request_id or request_id_from(None)
    logger.error("unexpected error while serving request %s", request_id, exc_info=exc)
    return APIError(
        500,
        f"internal error; see the server log for request {request_id}",
        type="server_error",
        code="internal_error",
        headers={"X-Request-Id": request_id},
    )


def not_ready() -> APIError:
    return to_api_error(
        EngineNotReadyError("the model is still loading; poll GET /ready")
    )


def engine_dead(detail: str = "") -> APIError:
    return to_api_error(
        EngineDeadError(
            f"the engine is dead{': ' + detail if detail else ''}; restart the server"
        )
    )
