"""The webhook outbox: one ``webhook_events`` row per job event and endpoint
(``schema.py``), written in the transaction of the job's status change
(``JobStore._update`` calls ``EventWriter.write``), so a status change and its events
commit together or not at all, and nothing between them can be lost to a crash.

Delivery (``webhooks/dispatcher.py``) works on the rows like the runner on jobs: every
change two instances could race for is one conditional ``UPDATE`` whose row count says
who won. An attempt is claimed by moving the row to ``delivering`` with
``attempts + 1``, compared against the attempt count read before, so two instances
never make the same attempt; a claim that outlives its ``claim_until`` (the instance
died mid-delivery) is due again, with the same event id (at-least-once).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import and_, or_, select

from diffserve.entrypoints.jobs.schema import jobs, webhook_events
from diffserve.entrypoints.jobs.store import COMPLETED, FAILED, IN_PROGRESS, Job

PENDING, DELIVERING, DELIVERED, DEAD = "pending", "delivering", "delivered", "dead"
STATUSES = (PENDING, DELIVERING, DELIVERED, DEAD)
EVENT_TYPES = {
    IN_PROGRESS: "video.in_progress",
    COMPLETED: "video.completed",
    FAILED: "video.failed",
}
_t = webhook_events.c


def new_event_id() -> str:
    """128 random bits: the ``webhook-id`` of every attempt of one event."""
    return "evt_" + secrets.token_hex(16)


def redacted(url: str) -> str:
    """``url`` without its query string and fragment (they may carry a token): what the
    API shows."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@dataclass(frozen=True)
class WebhookEvent:
    id: str
    job_id: str
    url: str
    event: str
    payload: str
    status: str
    attempts: int
    next_attempt_at: float
    claimed_by: str | None
    claim_until: float | None
    last_error: str | None
    last_status: int | None
    created_at: float
    delivered_at: float | None

    @classmethod
    def from_row(cls, row: Any) -> WebhookEvent:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    def public(self) -> dict[str, Any]:
        """The event as the API shows it (``GET /v1/videos/{id}``'s ``webhooks``, the
        dead-letter list): no payload, the URL without its query string."""
        waiting = self.status in (PENDING, DELIVERING)
        return {
            "id": self.id,
            "object": "webhook.event",
            "video_id": self.job_id,
            "url": redacted(self.url),
            "event": self.event,
            "status": self.status,
            "attempts": self.attempts,
            "last_status": self.last_status,
            "last_error": self.last_error,
            "next_attempt_at": int(self.next_attempt_at) if waiting else None,
            "created_at": int(self.created_at),
            "delivered_at": int(self.delivered_at) if self.delivered_at else None,
        }


class EventWriter:
    """Writes a job's events inside the store's status-change transaction.

    ``endpoints``: the server's; a job's own ``webhook_url`` (checked when it was
    created) is added. ``render``: the video object of a job (the payload's ``data``,
    fixed now: every attempt sends the same bytes). ``on_commit``: called after the
    transaction committed (wakes the dispatcher)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        render: Callable[[Job], dict[str, Any]],
        *,
        in_progress: bool = False,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self.endpoints = tuple(endpoints)
        self.render = render
        self.in_progress = in_progress
        self.on_commit = on_commit

    def targets(self, job: Job) -> list[str]:
        own = job.request.get("webhook_url")
        return list(dict.fromkeys([*self.endpoints, *([own] if own else [])]))

    def write(self, connection: Any, job_id: str, status: str) -> int:
        """The events of ``job_id`` having moved to ``status``, on ``connection`` (the
        status change's transaction); how many rows."""
        event = EVENT_TYPES.get(status)
        if event is None or (status == IN_PROGRESS and not self.in_progress):
            return 0
        row = connection.execute(select(jobs).where(jobs.c.id == job_id)).first()
        job = Job.from_row(row)
        urls = self.targets(job)
        if not urls:
            return 0
        now = time.time()
        stamp = datetime.fromtimestamp(now, timezone.utc).isoformat()
        # Standard Webhooks' envelope; compact, and never re-serialised: the signature
        # covers these bytes.
        payload = json.dumps(
            {"type": event, "timestamp": stamp, "data": self.render(job)},
            separators=(",", ":"),
        )
        connection.execute(
            webhook_events.insert(),
            [
                dict(
                    id=new_event_id(),
                    job_id=job_id,
                    url=url,
                    event=event,
                    payload=payload,
                    status=PENDING,
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now,
                )
                for url in urls
            ],
        )
        return len(urls)

    def committed(self) -> None:
        if self.on_commit is not None:
            self.on_commit()


class Outbox:
    """The ``webhook_events`` rows of one job store (its SQLAlchemy engine). Every
    method blocks: call it from a worker thread."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    # -- delivering
    # ------------------------------------------------------------------------------

    def due(self, *, now: float, limit: int) -> list[WebhookEvent]:
        """Events whose next attempt is due, or whose claim expired (its instance
        stopped mid-delivery), oldest due first."""
        where = or_(
            and_(_t.status == PENDING, _t.next_attempt_at <= now),
            and_(_t.status == DELIVERING, _t.claim_until < now),
        )
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(webhook_events)
                .where(where)
                .order_by(_t.next_attempt_at, _t.id)
                .limit(limit)
            ).all()
        return [WebhookEvent.from_row(row) for row in rows]

    def claim(
        self, event: WebhookEvent, owner: str, *, now: float, claim_s: float
    ) -> WebhookEvent | None:
        """Attempt ``event.attempts + 1`` of ``event`` for ``owner``, if still due and
        nobody took it since it was read; the claimed event, or None."""
        where = and_(
            _t.id == event.id,
            _t.attempts == event.attempts,
            or_(
                and_(_t.status == PENDING, _t.next_attempt_at <= now),
                and_(_t.status == DELIVERING, _t.claim_until < now),
            ),
        )
        values = dict(
            status=DELIVERING,
            claimed_by=owner,
            claim_until=now + claim_s,
            attempts=event.attempts + 1,
        )
        if not self._update(where, **values):
            return None
        return WebhookEvent(**{**event.__dict__, **values})

    def delivered(
        self, event: WebhookEvent, owner: str, *, now: float, status_code: int
    ) -> bool:
        return self._update(
            self._held(event, owner),
            status=DELIVERED,
            delivered_at=now,
            last_status=status_code,
            last_error=None,
            claimed_by=None,
            claim_until=None,
        )

    def failed(
        self,
        event: WebhookEvent,
        owner: str,
        *,
        error: str,
        status_code: int | None,
        retry_at: float | None,
    ) -> bool:
        """The attempt failed: due again at ``retry_at``, or ``dead`` (None)."""
        return self._update(
            self._held(event, owner),
            status=PENDING if retry_at is not None else DEAD,
            next_attempt_at=retry_at if retry_at is not None else event.next_attempt_at,
            last_error=error[:1000],
            last_status=status_code,
            claimed_by=None,
            claim_until=None,
        )

    def bury(self, *, now: float, max_attempts: int) -> int:
        """Dead-letter events whose last allowed attempt's instance died mid-delivery
        (its claim expired): no attempt is left to make."""
        where = and_(
            _t.status == DELIVERING, _t.claim_until < now, _t.attempts >= max_attempts
        )
        with self.engine.begin() as connection:
            return int(
                connection.execute(
                    webhook_events.update()
                    .where(where)
                    .values(
                        status=DEAD,
                        last_error="the instance delivering the last attempt stopped",
                        claimed_by=None,
                        claim_until=None,
                    )
                ).rowcount
            )

    def purge(self) -> int:
        """Delete the delivered events of jobs that are gone (deleted, or expired with
        their files): nothing is left to deliver or show. Pending and dead events stay:
        a delivery outlives its job."""
        gone = _t.job_id.not_in(select(jobs.c.id))
        with self.engine.begin() as connection:
            return int(
                connection.execute(
                    webhook_events.delete().where(and_(_t.status == DELIVERED, gone))
                ).rowcount
            )

    def release(self, owner: str, *, now: float) -> int:
        """``owner``'s claims, at its restart: due now (the attempt they were making
        died with the previous run), not when they would have expired."""
        where = and_(_t.status == DELIVERING, _t.claimed_by == owner)
        with self.engine.begin() as connection:
            return int(
                connection.execute(
                    webhook_events.update().where(where).values(claim_until=now - 1)
                ).rowcount
            )

    # -- the API
    # ----------------------------------------------------------------------------------

    def get(self, event_id: str) -> WebhookEvent | None:
        with self.engine.connect() as connection:
            row = connection.execute(
                select(webhook_events).where(_t.id == event_id)
            ).first()
        return WebhookEvent.from_row(row) if row is not None else None

    def for_job(self, job_id: str) -> list[WebhookEvent]:
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(webhook_events)
                .where(_t.job_id == job_id)
                .order_by(_t.created_at, _t.id)
            ).all()
        return [WebhookEvent.from_row(row) for row in rows]

    def page(
        self, *, status: str | None, after: str | None = None, limit: int = 20
    ) -> tuple[list[WebhookEvent], bool]:
        """Events (of ``status``, when given), newest first, after the event
        ``after`` (KeyError when it is gone); whether more follow."""
        query = select(webhook_events)
        if status is not None:
            query = query.where(_t.status == status)
        if after is not None:
            anchor = self.get(after)
            if anchor is None:
                raise KeyError(after)
            query = query.where(
                or_(
                    _t.created_at < anchor.created_at,
                    and_(_t.created_at == anchor.created_at, _t.id < anchor.id),
                )
            )
        query = query.order_by(_t.created_at.desc(), _t.id.desc()).limit(limit + 1)
        with self.engine.connect() as connection:
            rows = connection.execute(query).all()
        return [WebhookEvent.from_row(r) for r in rows[:limit]], len(rows) > limit

    def retry(self, event_id: str, *, now: float) -> bool:
        """A dead event back to ``pending``, due now, with a fresh attempt budget."""
        return self._update(
            and_(_t.id == event_id, _t.status == DEAD),
            status=PENDING,
            attempts=0,
            next_attempt_at=now,
        )

    def _held(self, event: WebhookEvent, owner: str) -> Any:
        # This attempt only: a claim that expired and was taken over records nothing.
        return and_(
            _t.id == event.id,
            _t.status == DELIVERING,
            _t.claimed_by == owner,
            _t.attempts == event.attempts,
        )

    def _update(self, where: Any, **values: Any) -> bool:
        with self.engine.begin() as connection:
            statement = webhook_events.update().where(where).values(**values)
            return bool(connection.execute(statement).rowcount == 1)
