"""The one exception -> response mapping of the HTTP routes: every failure of a route
becomes OpenAI's error body with the status ``api_errors.to_api_error`` gives it (an
unexpected one logged under the request's id)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from diffserve.entrypoints.api_errors import APIError, request_id_from, to_api_error


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def error_of(exc: BaseException, request: Request) -> JSONResponse:
    """``exc`` raised while serving ``request``, as the response the client gets."""
    return error_response(
        to_api_error(exc, request_id_from(request.headers.get("x-request-id")))
    )


async def answered(
    request: Request, call: Callable[[], Awaitable[Response]]
) -> Response:
    """``call()``'s response, or its failure's error response."""
    try:
        return await call()
    except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI-shaped error
        return error_of(exc, request)
