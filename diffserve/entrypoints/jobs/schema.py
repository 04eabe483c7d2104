"""The job store's one schema, versioned: ``video_jobs`` (one row per job),
``webhook_events`` (the webhook outbox: one row per event and endpoint, ``outbox.py``)
and ``diffserve_schema`` (the applied migration). Each migration is applied once, in
order, inside one transaction, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError

metadata = MetaData()

jobs = Table(
    "video_jobs",
    metadata,
    Column("id", String(64), primary_key=True),  # "video_" + 128 random bits in hex
    Column("model", String(512), nullable=False),
    Column("prompt", Text, nullable=False),
    Column(
        "status", String(16), nullable=False
    ),  # queued | in_progress | completed | failed
    Column("progress", Integer, nullable=False),  # 0-100
    Column("request", Text, nullable=False),  # JSON: the request's fields as admitted
    Column("created_at", Float, nullable=False),  # unix seconds
    Column("completed_at", Float),
    Column("expires_at", Float),
    Column("error_code", String(64)),
    Column("error_message", Text),
    Column("result", Text),  # JSON: seed, steps, frames, fps, attestation
    Column("idempotency_key", String(256), unique=True),
    Column(
        "request_hash", String(64)
    ),  # sha256 of the canonical request body, for Idempotency-Key checks
    Column("owner", String(128)),  # the instance that holds the job's lease
    Column("lease_until", Float),
)
Index("video_jobs_created", jobs.c.created_at, jobs.c.id)
Index("video_jobs_status", jobs.c.status)

webhook_events = Table(
    "webhook_events",
    metadata,
    # "evt_" + 128 random bits in hex: the webhook-id header of every attempt
    Column("id", String(64), primary_key=True),
    Column("job_id", String(64), nullable=False),  # no foreign key: outlives the job
    Column("url", Text, nullable=False),
    Column("event", String(64), nullable=False),  # video.completed | video.failed | ...
    Column("payload", Text, nullable=False),  # the signed body, fixed at creation
    Column(
        "status", String(16), nullable=False
    ),  # pending | delivering | delivered | dead
    Column("attempts", Integer, nullable=False),
    Column("next_attempt_at", Float, nullable=False),  # unix seconds
    Column("claimed_by", String(128)),  # the instance delivering the current attempt
    Column("claim_until", Float),
    Column("last_error", Text),
    Column("last_status", Integer),  # the receiver's last HTTP status
    Column("created_at", Float, nullable=False),
    Column("delivered_at", Float),
)
Index("webhook_events_due", webhook_events.c.status, webhook_events.c.next_attempt_at)
Index("webhook_events_job", webhook_events.c.job_id)
Index("webhook_events_created", webhook_events.c.created_at, webhook_events.c.id)

schema_version = Table(
    "diffserve_schema", metadata, Column("version", Integer, nullable=False)
)


def _create_v1(connection: Any) -> None:
    metadata.create_all(connection, tables=[jobs])


def _create_v2(connection: Any) -> None:
    metadata.create_all(connection, tables=[webhook_events])


# Append only: a released migration never changes (stores in the field have applied it).
MIGRATIONS: tuple[Callable[[Any], None], ...] = (_create_v1, _create_v2)


# PostgreSQL advisory lock key of the migration ("diffserv" in ASCII): instances that
# start together against a fresh database take turns, so only the first creates the
# tables (two concurrent CREATE TABLEs collide in the catalogue, "duplicate key value
# violates unique constraint pg_type_typname_nsp_index").
MIGRATION_LOCK = 0x6469666673657276
_ATTEMPTS = 3


def migrate(engine: Any) -> int:
    """Bring the database to the latest schema version; the version it is at afterwards.
    Safe when several instances start at once: they take turns (PostgreSQL: an advisory
    lock; SQLite: the database's write lock, taken first), and one that still lost a
    race (a lock wait past the store's timeout) retries."""
    for attempt in range(_ATTEMPTS):
        try:
            return _migrate_once(engine)
        except DBAPIError:
            if attempt == _ATTEMPTS - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _migrate_once(engine: Any) -> int:
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK}
            )
        elif connection.dialect.name == "sqlite":
            # The write lock now, not at the first write: else two instances both read
            # "no version row" and both insert one (the driver begins a transaction
            # lazily, at the first INSERT).
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        metadata.create_all(connection, tables=[schema_version])
        current = connection.execute(select(schema_version.c.version)).scalar()
        if current is None:
            connection.execute(schema_version.insert().values(version=0))
            current = 0
        for version, step in enumerate(MIGRATIONS[current:], start=current + 1):
            step(connection)
            connection.execute(schema_version.update().values(version=version))
        return len(MIGRATIONS)


def sqlite_pragmas(connection: Any, _record: Any) -> None:
    """WAL: readers never block the writer and a crash leaves the last committed
    state."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
