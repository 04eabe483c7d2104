"""``/v1/webhooks/events``: the webhook outbox as the API shows it (docs/webhooks.md):
a page of events by status (``?status=dead``: the dead letters) and the retry of a dead
event. Served where ``server.webhooks`` is configured."""

from __future__ import annotations

import asyncio
import re

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from diffserve.entrypoints.api_errors import APIError
from diffserve.entrypoints.jobs.outbox import STATUSES
from diffserve.entrypoints.openai.answers import answered
from diffserve.entrypoints.openai.list_query import check_names, fetch_page, list_page
from diffserve.entrypoints.webhooks.setup import Webhooks
from diffserve.errors import RequestError

EVENTS_PATH = "/v1/webhooks/events"
EVENT_ID = re.compile(r"evt_[0-9a-f]{32}")


async def list_events(webhooks: Webhooks, request: Request) -> Response:
    query = request.query_params
    check_names(query, {"status", "after", "limit"})
    status = query.get("status")
    if status is not None and status not in STATUSES:
        raise RequestError(
            f"status={status[:20]!r} must be one of {', '.join(STATUSES)}",
            param="status",
        )
    events, more = await fetch_page(
        query, webhooks.outbox.page, id_pattern=EVENT_ID, noun="event", status=status
    )
    return JSONResponse(list_page([event.public() for event in events], more))


async def retry_event(webhooks: Webhooks, event_id: str) -> Response:
    """A dead event to ``pending`` (attempts from zero): 404 unknown, 409 not dead."""
    event = None
    if EVENT_ID.fullmatch(event_id):
        event = await asyncio.to_thread(webhooks.outbox.get, event_id)
    if event is None:
        raise APIError(
            404,
            f"no webhook event {event_id[:80]!r}",
            param="event_id",
            code="event_not_found",
        )
    if not await asyncio.to_thread(webhooks.retry, event_id):
        raise APIError(
            409,
            f"webhook event {event_id} is {event.status}; only a dead event is retried",
            param="event_id",
            code="event_not_dead",
        )
    again = await asyncio.to_thread(webhooks.outbox.get, event_id)
    return JSONResponse(again.public() if again is not None else None)


def add_webhook_routes(app: FastAPI, webhooks: Webhooks) -> None:
    @app.get(EVENTS_PATH)
    async def webhook_events(request: Request) -> Response:
        return await answered(request, lambda: list_events(webhooks, request))

    @app.post(EVENTS_PATH + "/{event_id}/retry")
    async def retry_webhook_event(event_id: str, request: Request) -> Response:
        return await answered(request, lambda: retry_event(webhooks, event_id))
