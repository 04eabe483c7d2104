"""A list route (``GET /v1/videos``, ``GET /v1/webhooks/events``): its query string
holds only the parameters the route names, and OpenAI's page size, ``limit`` 1..100 (20
when absent), anything else a 400 naming the parameter; its answer is OpenAI's list
object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diffserve.errors import RequestError

DEFAULT_LIMIT, MAX_LIMIT = 20, 100


def check_names(query: Mapping[str, str], allowed: set[str]) -> None:
    unknown = sorted(set(query) - allowed)
    if unknown:
        raise RequestError(
            f"unknown query parameter {unknown[0]!r}",
            param=unknown[0],
            code="unknown_parameter",
        )


def page_limit(query: Mapping[str, str]) -> int:
    text = query.get("limit", str(DEFAULT_LIMIT))
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise RequestError(
            f"limit={text[:20]!r} must be an integer in [1, {MAX_LIMIT}]", param="limit"
        )
    return int(text)


def list_page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's list object of one page of ``data`` (each with an ``id``)."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }
