"""A list route (``GET /v1/videos``, ``GET /v1/webhooks/events``): its query string
holds only the parameters the route names, and OpenAI's page size, ``limit`` 1..100 (20
when absent), anything else a 400 naming the parameter; its answer is OpenAI's list
object."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from diffserve.errors import RequestError

DEFAULT_LIMIT, MAX_LIMIT = 20, 100
Row = TypeVar("Row")


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


async def fetch_page(
    query: Mapping[str, str],
    page: Callable[..., tuple[list[Row], bool]],
    *,
    id_pattern: re.Pattern[str],
    noun: str,
    **filters: Any,
) -> tuple[list[Row], bool]:
    """One page from a store's ``page(after=, limit=, **filters)`` (run off the event
    loop): ``limit`` checked, ``after`` an id of the ``noun``'s shape that the store
    knows, else a 400 naming ``after``."""
    limit = page_limit(query)
    after = query.get("after")
    if after is not None and not id_pattern.fullmatch(after):
        article = "an" if noun[0] in "aeiou" else "a"
        raise RequestError(
            f"after={after[:80]!r} is not {article} {noun} id", param="after"
        )
    try:
        return await asyncio.to_thread(page, after=after, limit=limit, **filters)
    except KeyError:
        raise RequestError(f"after={after!r}: no such {noun}", param="after") from None
