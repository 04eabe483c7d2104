"""The video job store on a real SQLite file (WAL) and a real PostgreSQL server:
migrations applied once, pages in creation order, the Idempotency-Key rules, leases that
only one instance wins (threads racing on two store objects over one file), restart and
lease-expiry recovery, and atomic artifacts whose paths come from job ids only."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from diffserve.entrypoints.jobs.artifacts import ArtifactDir
from diffserve.entrypoints.jobs.schema import MIGRATIONS
from diffserve.entrypoints.jobs.store import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    IdempotencyConflict,
    JobStore,
)

REQUEST = {"num_frames": 9, "size": "64x64", "seed": 3}


@pytest.fixture
def store(url: str) -> Iterator[JobStore]:
    opened = JobStore(url)
    yield opened
    opened.close()


def create(store: JobStore, now: float, **extra: object) -> str:
    job, created = store.create(
        model="tiny-wan", prompt="a ball", request=REQUEST, now=now, **extra
    )  # type: ignore[arg-type]
    assert created and job.status == QUEUED and job.progress == 0
    return job.id


def test_the_schema_is_migrated_once_and_sqlite_runs_in_wal(
    url: str, tmp_path: Path
) -> None:
    first = JobStore(url)
    job_id = create(first, 1.0)
    first.close()
    again = JobStore(url)  # reopening applies nothing twice and keeps the rows
    assert again.version == len(MIGRATIONS) and again.get(job_id) is not None
    with again.engine.connect() as connection:
        assert connection.execute(
            text("SELECT version FROM diffserve_schema")
        ).all() == [(len(MIGRATIONS),)]
    again.close()
    if not url.startswith("sqlite"):
        return
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT version FROM diffserve_schema").fetchall() == [
            (len(MIGRATIONS),)
        ]


def test_instances_starting_together_migrate_a_fresh_database_once(url: str) -> None:
    """Several instances opening one fresh store at the same moment (a deployment's
    replicas starting together): every one opens, the tables exist once and the version
    row is one row (the CI met two servers' CREATE TABLEs colliding on PostgreSQL)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        opened = list(pool.map(lambda _: JobStore(url), range(4)))
    try:
        assert [s.version for s in opened] == [len(MIGRATIONS)] * 4
        with opened[0].engine.connect() as connection:
            assert connection.execute(
                text("SELECT version FROM diffserve_schema")
            ).all() == [(len(MIGRATIONS),)]
        assert (
            create(opened[1], 1.0) and opened[2].get(create(opened[3], 2.0)) is not None
        )
    finally:
        for s in opened:
            s.close()


def test_jobs_page_in_creation_order_and_text_is_stored_as_given(
    store: JobStore,
) -> None:
    ids = [create(store, float(t)) for t in range(5)]
    hostile = "'; DROP TABLE video_jobs; --"
    job, _ = store.create(model="tiny-wan", prompt=hostile, request={}, now=9.0)
    assert store.get(job.id).prompt == hostile  # type: ignore[union-attr]  # bound parameters, never SQL text
    page, more = store.page(limit=3)
    assert [j.id for j in page] == [job.id, ids[4], ids[3]] and more
    page, more = store.page(after=ids[3], limit=3)
    assert [j.id for j in page] == [ids[2], ids[1], ids[0]] and not more
    page, more = store.page(order="asc", limit=2, after=ids[0])
    assert [j.id for j in page] == ids[1:3] and more
    with pytest.raises(KeyError):
        store.page(after="video_" + "0" * 32)
    # 128 random bits each.
    assert all(len(i) == len("video_") + 32 for i in ids) and len(set(ids)) == 5


def test_idempotency_key_returns_the_same_job_or_refuses_another_body(
    store: JobStore,
) -> None:
    first = create(store, 1.0, idempotency_key="k1", request_hash="h1")
    again, created = store.create(
        model="tiny-wan",
        prompt="a ball",
        request=REQUEST,
        now=2.0,
        idempotency_key="k1",
        request_hash="h1",
    )
    assert not created and again.id == first
    with pytest.raises(IdempotencyConflict, match="k1"):
        store.create(
            model="tiny-wan",
            prompt="a cube",
            request=REQUEST,
            now=3.0,
            idempotency_key="k1",
            request_hash="h2",
        )
    assert len(store.page(limit=10)[0]) == 1


def test_one_instance_wins_a_lease_and_only_it_advances_the_job(
    url: str, store: JobStore
) -> None:
    other = JobStore(url)  # a second server instance on the same database
    try:
        job_id = create(store, 1.0)
        wins: list[str] = []
        barrier = threading.Barrier(8)

        def race(name: str, instance: JobStore) -> None:
            barrier.wait()
            if instance.claim(job_id, name, now=2.0, lease_s=30.0):
                wins.append(name)

        threads = [
            threading.Thread(
                target=race, args=(f"instance-{i}", store if i % 2 else other)
            )
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(wins) == 1
        owner, loser = wins[0], "instance-x"
        assert not other.start(job_id, loser, now=3.0, lease_s=30.0)
        assert other.start(job_id, owner, now=3.0, lease_s=30.0)
        assert store.get(job_id).status == IN_PROGRESS  # type: ignore[union-attr]
        assert other.heartbeat(job_id, owner, now=4.0, lease_s=30.0, progress=40)
        assert not store.heartbeat(job_id, loser, now=4.0, lease_s=30.0, progress=90)
        assert store.get(job_id).progress == 40  # type: ignore[union-attr]
        assert not store.complete(job_id, loser, now=5.0, result={}, expires_at=None)
        assert store.complete(
            job_id, owner, now=5.0, result={"seed": 3}, expires_at=100.0
        )
        done = other.get(job_id)
        assert done is not None and (done.status, done.progress, done.result) == (
            COMPLETED,
            100,
            {"seed": 3},
        )
        # A finished job stays finished.
        assert not store.fail(job_id, "late", "too late", now=6.0)
    finally:
        other.close()


@pytest.mark.parametrize("requeue", [False, True])
def test_restart_and_expired_leases_fail_or_requeue_without_stealing_live_ones(
    store: JobStore, requeue: bool
) -> None:
    mine, dead, alive = create(store, 1.0), create(store, 2.0), create(store, 3.0)
    assert store.claim(mine, "me", now=4.0, lease_s=10.0) and store.start(
        mine, "me", now=4.0, lease_s=10.0
    )
    assert store.claim(dead, "gone", now=4.0, lease_s=10.0) and store.start(
        dead, "gone", now=4.0, lease_s=10.0
    )
    assert store.claim(alive, "other", now=4.0, lease_s=100.0)
    # This instance restarted.
    assert store.recover(now=5.0, requeue=requeue, owner="me") == [mine]
    # "gone"'s lease expired; "other"'s did not.
    assert store.recover(now=20.0, requeue=requeue) == [dead]
    for job_id in (mine, dead):
        job = store.get(job_id)
        assert job is not None and job.owner is None
        if requeue:
            assert (job.status, job.progress) == (QUEUED, 0)
        else:
            assert (job.status, job.error_code) == (FAILED, "server_restart")
    assert store.get(alive).owner == "other"  # type: ignore[union-attr]
    # Not alive.
    assert [j.id for j in store.claimable(now=20.0)] == (
        [mine, dead] if requeue else []
    )


def test_expiry_and_delete(store: JobStore) -> None:
    job_id = create(store, 1.0)
    assert store.claim(job_id, "me", now=1.0, lease_s=5.0)
    assert store.complete(job_id, "me", now=2.0, result={}, expires_at=10.0)
    assert store.expired(9.9) == [] and store.expired(10.0) == [job_id]
    assert (
        store.delete(job_id) and store.get(job_id) is None and not store.delete(job_id)
    )


def test_artifacts_publish_whole_files_from_job_ids_only(tmp_path: Path) -> None:
    artifacts = ArtifactDir(tmp_path / "artifacts")
    job_id = "video_" + "ab" * 16
    for bad in ("../../etc/passwd", "video_../x", job_id.upper()):
        with pytest.raises(ValueError, match="not a job id"):
            artifacts.path(bad)

    def broken(path: Path) -> None:
        path.write_bytes(b"half a video")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        artifacts.publish(job_id, "video", broken)
    # Neither the file nor its temporary copy.
    assert list(artifacts.root.iterdir()) == []
    published = artifacts.publish(
        job_id, "video", lambda path: path.write_bytes(b"mp4")
    )
    assert published.read_bytes() == b"mp4" and artifacts.exists(job_id)
    (artifacts.root / f"{job_id}.webp.partial").write_bytes(b"crashed")
    (artifacts.root / "notes.txt").write_bytes(b"not ours")
    # What the orphan sweep compares with the store's rows.
    assert artifacts.outputs() == [job_id]
    artifacts.remove(job_id)  # every file of the job, a crash's temporary one included
    assert not artifacts.exists(job_id) and [
        p.name for p in artifacts.root.iterdir()
    ] == ["notes.txt"]
