"""The job store's databases for the tests of one module: a real PostgreSQL server
(tests/pg_server.py; skipped where its binaries are missing) and ``url``, a fresh
database per test on SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_server import postgres_bin, postgres_server


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed here (make postgres installs it)")
    with postgres_server() as base:
        yield base


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database per test, on each store."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    import psycopg

    base = request.getfixturevalue("postgres")
    name = f"jobs_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(
        base.replace("postgresql+psycopg", "postgresql") + "/postgres", autocommit=True
    ) as admin:
        # A name this test made: no request data.
        admin.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"
