"""The job store: video jobs as rows of one SQL schema (``schema.py``) through
SQLAlchemy Core, on SQLite (WAL, the embedded default) or PostgreSQL (several server
instances sharing it). Every statement takes bound parameters; every change that two
instances could race for is one conditional ``UPDATE`` whose row count says who won (a
lease: ``owner`` + ``lease_until``), so a job never runs on two instances at once.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import and_, create_engine, event, or_, select

from diffserve.entrypoints.jobs.schema import jobs, migrate, sqlite_pragmas
from diffserve.logging import get_logger

logger = get_logger(__name__)

QUEUED, IN_PROGRESS, COMPLETED, FAILED = "queued", "in_progress", "completed", "failed"
FINISHED = (COMPLETED, FAILED)


class EventWriter(Protocol):
    """Writes a status change's webhook events in its transaction (``outbox.py``)."""

    def write(self, connection: Any, job_id: str, status: str) -> int: ...
    def committed(self) -> None: ...


class IdempotencyConflict(Exception):
    """The Idempotency-Key names a job created from another request body."""


@dataclass(frozen=True)
class Job:
    id: str
    model: str
    prompt: str
    status: str
    progress: int
    request: dict[str, Any]
    created_at: float
    completed_at: float | None
    expires_at: float | None
    error_code: str | None
    error_message: str | None
    result: dict[str, Any] | None
    owner: str | None
    lease_until: float | None

    @classmethod
    def from_row(cls, row: Any) -> Job:
        return cls(
            id=row.id,
            model=row.model,
            prompt=row.prompt,
            status=row.status,
            progress=row.progress,
            request=json.loads(row.request),
            created_at=row.created_at,
            completed_at=row.completed_at,
            expires_at=row.expires_at,
            error_code=row.error_code,
            error_message=row.error_message,
            result=json.loads(row.result) if row.result else None,
            owner=row.owner,
            lease_until=row.lease_until,
        )


def new_job_id() -> str:
    """128 random bits: unguessable, and safe as a file name (hex only)."""
    return "video_" + secrets.token_hex(16)


class JobStore:
    """One database of video jobs. ``url``: ``sqlite:///PATH`` or
    ``postgresql+psycopg://...``; ``timeout_s`` bounds every wait for the database (a
    lock, a connection)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        self.url = url
        if url.startswith("sqlite"):
            self.engine = create_engine(url, connect_args={"timeout": timeout_s})
            event.listen(self.engine, "connect", sqlite_pragmas)
        else:
            self.engine = create_engine(
                url,
                pool_pre_ping=True,
                pool_timeout=timeout_s,
                connect_args={"connect_timeout": max(1, int(timeout_s))},
            )
        self.version = migrate(self.engine)
        # Webhooks (outbox.py): a status change writes its events in its transaction.
        self.events: EventWriter | None = None

    def close(self) -> None:
        self.engine.dispose()

    # -- create and read
    # ------------------------------------------------------------------------------

    def create(
        self,
        *,
        model: str,
        prompt: str,
        request: dict[str, Any],
        now: float,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> tuple[Job, bool]:
        """A new queued job, or the job an earlier create with this ``idempotency_key``
        and the same ``request_hash`` made (``created`` False); the same key with
        another hash raises IdempotencyConflict."""
        if idempotency_key is not None:
            existing = self._by_key(idempotency_key, request_hash)
            if existing is not None:
                return existing, False
        job_id = new_job_id()
        values = dict(
            id=job_id,
            model=model,
            prompt=prompt,
            status=QUEUED,
            progress=0,
            request=json.dumps(request, sort_keys=True),
            created_at=now,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
        )
        try:
            with self.engine.begin() as connection:
                connection.execute(jobs.insert().values(**values))
        except Exception:
            # Two creates with one key raced: the other insert won the unique key;
            # answer with its job.
            if idempotency_key is not None:
                existing = self._by_key(idempotency_key, request_hash)
                if existing is not None:
                    return existing, False
            raise
        job = self.get(job_id)
        assert job is not None
        return job, True

    def _by_key(self, key: str, request_hash: str | None) -> Job | None:
        with self.engine.connect() as connection:
            row = connection.execute(
                select(jobs).where(jobs.c.idempotency_key == key)
            ).first()
        if row is None:
            return None
        if row.request_hash != request_hash:
            raise IdempotencyConflict(
                f"Idempotency-Key {key!r} was used for another request body"
            )
        return Job.from_row(row)

    def get(self, job_id: str) -> Job | None:
        with self.engine.connect() as connection:
            row = connection.execute(select(jobs).where(jobs.c.id == job_id)).first()
        return Job.from_row(row) if row is not None else None

    def page(
        self, *, after: str | None = None, limit: int = 20, order: str = "desc"
    ) -> tuple[list[Job], bool]:
        """A page of jobs by creation time (``desc``: newest first), starting after the
        job ``after``; whether more follow."""
        newest_first = order == "desc"
        query = select(jobs)
        if after is not None:
            anchor = self.get(after)
            if anchor is None:
                raise KeyError(after)
            key = (jobs.c.created_at, jobs.c.id)
            if newest_first:
                query = query.where(
                    or_(
                        key[0] < anchor.created_at,
                        and_(key[0] == anchor.created_at, key[1] < anchor.id),
                    )
                )
            else:
                query = query.where(
                    or_(
                        key[0] > anchor.created_at,
                        and_(key[0] == anchor.created_at, key[1] > anchor.id),
                    )
                )
        columns = (
            (jobs.c.created_at.desc(), jobs.c.id.desc())
            if newest_first
            else (jobs.c.created_at, jobs.c.id)
        )
        with self.engine.connect() as connection:
            rows = connection.execute(query.order_by(*columns).limit(limit + 1)).all()
        return [Job.from_row(r) for r in rows[:limit]], len(rows) > limit

    # -- running: leases
    # ------------------------------------------------------------------------------

    def claim(self, job_id: str, owner: str, *, now: float, lease_s: float) -> bool:
        """Take the lease of a queued job nobody holds (or whose holder's lease
        expired); True if won."""
        free = or_(jobs.c.owner.is_(None), jobs.c.lease_until < now)
        return self._update(
            and_(jobs.c.id == job_id, jobs.c.status == QUEUED, free),
            owner=owner,
            lease_until=now + lease_s,
        )

    def start(self, job_id: str, owner: str, *, now: float, lease_s: float) -> bool:
        """``in_progress``: the first denoise step ran on ``owner``, which holds the
        lease."""
        return self._update(
            self._held(job_id, owner),
            job_id,
            status=IN_PROGRESS,
            lease_until=now + lease_s,
        )

    def heartbeat(
        self, job_id: str, owner: str, *, now: float, lease_s: float, progress: int
    ) -> bool:
        """Extend ``owner``'s lease and record progress; False when the lease was lost
        (stop the work)."""
        return self._update(
            self._held(job_id, owner), lease_until=now + lease_s, progress=progress
        )

    def complete(
        self,
        job_id: str,
        owner: str,
        *,
        now: float,
        result: dict[str, Any],
        expires_at: float | None,
    ) -> bool:
        """``completed``, after the artifact was published
        (``artifacts.ArtifactDir.publish``)."""
        return self._update(
            self._held(job_id, owner),
            job_id,
            status=COMPLETED,
            progress=100,
            completed_at=now,
            expires_at=expires_at,
            result=json.dumps(result, sort_keys=True),
            owner=None,
            lease_until=None,
        )

    def fail(
        self,
        job_id: str,
        code: str,
        message: str,
        *,
        now: float,
        owner: str | None = None,
        expires_at: float | None = None,
    ) -> bool:
        """``failed`` with an error, unless already finished (by ``owner`` only, when
        given)."""
        where = and_(jobs.c.id == job_id, jobs.c.status.not_in(FINISHED))
        if owner is not None:
            where = and_(where, jobs.c.owner == owner)
        return self._update(
            where,
            job_id,
            status=FAILED,
            error_code=code,
            error_message=message,
            completed_at=now,
            expires_at=expires_at,
            owner=None,
            lease_until=None,
        )

    def recover(
        self,
        *,
        now: float,
        requeue: bool,
        owner: str | None = None,
        expires_at: float | None = None,
    ) -> list[str]:
        """Jobs whose holder is gone: ``owner``'s own (at its restart) or, without
        ``owner``, every job whose lease expired (a dead instance's). Each is failed
        with ``server_restart`` or, with ``requeue``, queued again from the start. The
        ids handled."""
        held = (
            jobs.c.owner == owner
            if owner is not None
            else and_(jobs.c.owner.is_not(None), jobs.c.lease_until < now)
        )
        where = and_(held, jobs.c.status.not_in(FINISHED))
        with self.engine.connect() as connection:
            ids = [row.id for row in connection.execute(select(jobs.c.id).where(where))]
        done = []
        # One conditional update each: a job another survivor took is skipped.
        for job_id in ids:
            still = and_(jobs.c.id == job_id, where)
            if requeue:
                changed = self._update(
                    still, status=QUEUED, progress=0, owner=None, lease_until=None
                )
            else:
                changed = self._update(
                    still,
                    job_id,
                    status=FAILED,
                    error_code="server_restart",
                    completed_at=now,
                    error_message="the server running this job stopped "
                    "before it finished",
                    expires_at=expires_at,
                    owner=None,
                    lease_until=None,
                )
            if changed:
                done.append(job_id)
        return done

    def claimable(
        self, *, now: float, limit: int = 100, models: tuple[str, ...] | None = None
    ) -> list[Job]:
        """Queued jobs no live lease holds, oldest first (of ``models`` only, when
        given): what an instance with a free engine may claim."""
        where = and_(
            jobs.c.status == QUEUED,
            or_(jobs.c.owner.is_(None), jobs.c.lease_until < now),
        )
        if models is not None:
            where = and_(where, jobs.c.model.in_(models))
        with self.engine.connect() as connection:
            rows = connection.execute(
                select(jobs)
                .where(where)
                .order_by(jobs.c.created_at, jobs.c.id)
                .limit(limit)
            ).all()
        return [Job.from_row(r) for r in rows]

    def existing(self, job_ids: list[str]) -> set[str]:
        """Which of ``job_ids`` have a row (the artifact directory's orphan sweep)."""
        if not job_ids:
            return set()
        with self.engine.connect() as connection:
            return {
                row.id
                for row in connection.execute(
                    select(jobs.c.id).where(jobs.c.id.in_(job_ids))
                )
            }

    # -- ending
    # ----------------------------------------------------------------------------------

    def delete(self, job_id: str) -> bool:
        with self.engine.begin() as connection:
            return (
                connection.execute(jobs.delete().where(jobs.c.id == job_id)).rowcount
                == 1
            )

    def expired(self, now: float) -> list[str]:
        """Finished jobs whose ``expires_at`` has passed (delete their artifacts, then
        the rows)."""
        with self.engine.connect() as connection:
            return [
                row.id
                for row in connection.execute(
                    select(jobs.c.id).where(
                        and_(jobs.c.expires_at.is_not(None), jobs.c.expires_at <= now)
                    )
                )
            ]

    def _held(self, job_id: str, owner: str) -> Any:
        return and_(
            jobs.c.id == job_id, jobs.c.owner == owner, jobs.c.status.not_in(FINISHED)
        )

    def _update(self, where: Any, job_id: str | None = None, **values: Any) -> bool:
        # With job_id: a status change, and its events commit with it or not at all.
        with self.engine.begin() as connection:
            statement = jobs.update().where(where).values(**values)
            won = connection.execute(statement).rowcount == 1
            if won and job_id is not None and self.events is not None:
                self.events.write(connection, job_id, values["status"])
        if won and job_id is not None and self.events is not None:
            self.events.committed()
        return won
