"""Job webhooks in process: a real SQLite job store, the real dispatcher and a real
receiver on 127.0.0.1 (webhook_receiver.py) that fails, hangs, redirects and recovers.
Every delivery's signature is verified by the ``standardwebhooks`` package, with each
of two rotating secrets alone; a status change and its events commit together or not
at all; retries keep the event id; a hung receiver times out; an event out of attempts
is dead-lettered and retried by hand; a redirect is never followed; and the URL policy
refuses hostile webhook URLs (other hosts, private addresses not listed, credentials,
other schemes, a name rebound to a private address by delivery time)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from webhook_receiver import Receiver, receiver, verified

from diffserve.config.webhooks_schema import WebhooksConfig
from diffserve.entrypoints.jobs import schema
from diffserve.entrypoints.jobs.outbox import DEAD, DELIVERED, PENDING, WebhookEvent
from diffserve.entrypoints.jobs.store import COMPLETED, FAILED, QUEUED, JobStore
from diffserve.entrypoints.openai.video_protocol import video_object
from diffserve.entrypoints.webhooks.setup import Webhooks
from diffserve.entrypoints.webhooks.signing import SECRETS_ENV, load_secrets
from diffserve.entrypoints.webhooks.urls import UrlPolicy, WebhookURLError
from diffserve.errors import ConfigError

SECRET = "whsec_" + base64.b64encode(b"first secret, 32 bytes long....!").decode()
NEXT_SECRET = "whsec_" + base64.b64encode(b"second secret, also 32 bytes....").decode()
REQUEST = {"num_frames": 5, "width": 64, "height": 48, "seed": 3, "seconds": "1"}


@pytest.fixture
def hooks() -> Iterator[Receiver]:
    with receiver() as running:
        yield running


def config(hooks: Receiver, **values: Any) -> WebhooksConfig:
    settings: dict[str, Any] = dict(
        endpoints=(hooks.url + "/server",),
        allowed_hosts=(hooks.url.removeprefix("http://"),),
        max_attempts=5,
        backoff_s=0.01,
        backoff_max_s=0.05,
        timeout_s=5.0,
    )
    return WebhooksConfig(**{**settings, **values})


def open_store(tmp_path: Path) -> JobStore:
    return JobStore(f"sqlite:///{tmp_path / 'jobs.sqlite3'}")


def attach(
    store: JobStore, settings: WebhooksConfig, secrets: str = SECRET, owner: str = "a"
) -> Webhooks:
    return Webhooks(
        store,
        settings,
        owner=owner,
        render=video_object,
        environ={SECRETS_ENV: secrets},
        poll_s=0.05,
    )


def finish(store: JobStore, *, webhook_url: str | None = None, ok: bool = True) -> str:
    """A job created, claimed and completed (or failed) by owner ``a``."""
    request = {**REQUEST, **({"webhook_url": webhook_url} if webhook_url else {})}
    job, _ = store.create(model="m", prompt="a ball", request=request, now=time.time())
    assert store.claim(job.id, "a", now=time.time(), lease_s=30)
    if ok:
        assert store.complete(
            job.id, "a", now=time.time(), result={"seed": 3}, expires_at=None
        )
    else:
        assert store.fail(job.id, "engine_dead", "boom", now=time.time(), owner="a")
    return job.id


def events(webhooks: Webhooks, job_id: str) -> list[WebhookEvent]:
    return webhooks.outbox.for_job(job_id)


async def settled(webhooks: Webhooks, job_id: str, timeout: float = 20) -> list:
    """The job's events once none is pending or being delivered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = await asyncio.to_thread(events, webhooks, job_id)
        if rows and all(r.status in (DELIVERED, DEAD) for r in rows):
            return rows
        await asyncio.sleep(0.02)
    raise TimeoutError(f"events of {job_id} still moving: {rows}")


def run(webhooks: Webhooks, scenario: Any) -> Any:
    async def main() -> Any:
        await webhooks.start()
        try:
            return await asyncio.wait_for(scenario(), 60)
        finally:
            await webhooks.stop()

    return asyncio.run(main())


def test_deliveries_are_signed_with_both_secrets_while_one_rotates(
    tmp_path: Path, hooks: Receiver
) -> None:
    store = open_store(tmp_path)
    webhooks = attach(store, config(hooks), secrets=f"{SECRET},{NEXT_SECRET}")

    async def scenario() -> list:
        job_id = finish(store, webhook_url=hooks.url + "/own?token=t")
        return [job_id, await settled(webhooks, job_id)]

    job_id, rows = run(webhooks, scenario)
    # The server's endpoint and the request's own URL: one event each.
    assert {d.path for d in hooks.deliveries} == {"/server", "/own?token=t"}
    assert {r.id for r in rows} == set(hooks.ids()) and len(rows) == 2
    for delivery in hooks.deliveries:
        payload = verified(delivery, SECRET, NEXT_SECRET)  # each secret alone
        assert payload["type"] == "video.completed"
        assert payload["data"]["id"] == job_id
        assert payload["data"]["status"] == COMPLETED
        assert delivery.headers["webhook-id"].startswith("evt_")
    assert all(r.status == DELIVERED and r.attempts == 1 for r in rows)
    assert [r.public()["url"] for r in rows if "own" in r.url] == [hooks.url + "/own"]
    store.close()


def test_a_receiver_that_fails_twice_gets_three_attempts_of_one_event(
    tmp_path: Path, hooks: Receiver
) -> None:
    store = open_store(tmp_path)
    webhooks = attach(store, config(hooks))
    hooks.answer_next("fail", "fail")

    async def scenario() -> list:
        return await settled(webhooks, finish(store, ok=False))

    (row,) = run(webhooks, scenario)
    assert [d.answer for d in hooks.deliveries] == ["fail", "fail", "ok"]
    assert len(set(hooks.ids())) == 1 and hooks.ids()[0] == row.id
    assert (row.status, row.attempts, row.last_status) == (DELIVERED, 3, 204)
    for delivery in hooks.deliveries:
        assert verified(delivery, SECRET)["type"] == "video.failed"
    store.close()


def test_a_hung_receiver_times_out_and_the_next_attempt_delivers(
    tmp_path: Path, hooks: Receiver
) -> None:
    store = open_store(tmp_path)
    webhooks = attach(store, config(hooks, timeout_s=0.5))
    hooks.answer_next("hang")

    async def scenario() -> list:
        return await settled(webhooks, finish(store))

    started = time.monotonic()
    (row,) = run(webhooks, scenario)
    assert time.monotonic() - started < 10
    assert [d.answer for d in hooks.deliveries] == ["hang", "ok"]
    assert len(set(hooks.ids())) == 1
    assert (row.status, row.attempts) == (DELIVERED, 2)
    store.close()


def test_an_event_out_of_attempts_is_dead_lettered_and_retried_by_hand(
    tmp_path: Path, hooks: Receiver
) -> None:
    store = open_store(tmp_path)
    webhooks = attach(store, config(hooks, max_attempts=2))
    hooks.mode = "fail"

    async def scenario() -> tuple:
        job_id = finish(store)
        (dead,) = await settled(webhooks, job_id)
        letters, more = webhooks.outbox.page(status=DEAD)
        hooks.mode = "ok"
        assert webhooks.retry(dead.id) and not webhooks.retry(dead.id)
        return dead, letters, more, await settled(webhooks, job_id)

    dead, letters, more, (again,) = run(webhooks, scenario)
    assert (dead.status, dead.attempts, dead.last_status) == (DEAD, 2, 500)
    assert dead.last_error == "HTTP 500"
    assert [e.id for e in letters] == [dead.id] and not more
    assert dead.public()["next_attempt_at"] is None
    assert (again.id, again.status, again.attempts) == (dead.id, DELIVERED, 1)
    assert hooks.ids() == [dead.id] * 3
    store.close()


@pytest.mark.parametrize("target", ["metadata", "another allowed host"])
def test_a_redirect_is_a_failed_attempt_never_followed(
    tmp_path: Path, hooks: Receiver, target: str
) -> None:
    store = open_store(tmp_path)
    with receiver() as other:
        allowed = (hooks.url.removeprefix("http://"), other.url.removeprefix("http://"))
        webhooks = attach(store, config(hooks, max_attempts=1, allowed_hosts=allowed))
        hooks.mode = "redirect"
        if target != "metadata":
            hooks.redirect_to = other.url + "/elsewhere"

        async def scenario() -> list:
            return await settled(webhooks, finish(store))

        (row,) = run(webhooks, scenario)
        assert other.deliveries == []  # not even to a host the policy allows
    assert (row.status, row.last_status) == (DEAD, 302)
    assert "redirect not followed" in (row.last_error or "")
    assert len(hooks.deliveries) == 1  # and nothing else was requested
    store.close()


def test_a_status_change_and_its_events_commit_together(
    tmp_path: Path, hooks: Receiver
) -> None:
    store = open_store(tmp_path)
    webhooks = attach(store, config(hooks, in_progress_events=True))
    job, _ = store.create(model="m", prompt="p", request=REQUEST, now=time.time())
    # A lost lease (another owner): no status change, so no event.
    assert not store.complete(job.id, "b", now=1.0, result={}, expires_at=None)
    assert store.claim(job.id, "a", now=time.time(), lease_s=30)
    assert store.start(job.id, "a", now=time.time(), lease_s=30)  # opted in
    assert [e.event for e in events(webhooks, job.id)] == ["video.in_progress"]

    class Broken:
        def write(self, connection: Any, job_id: str, status: str) -> int:
            webhooks.writer.write(connection, job_id, status)
            raise RuntimeError("the outbox insert failed")

        def committed(self) -> None:
            raise AssertionError("not committed")

    store.events = Broken()
    with pytest.raises(RuntimeError):
        store.complete(job.id, "a", now=time.time(), result={}, expires_at=None)
    # Neither the status nor the events of the failed transaction stayed.
    assert store.get(job.id).status != COMPLETED  # type: ignore[union-attr]
    assert len(events(webhooks, job.id)) == 1
    store.events = webhooks.writer
    assert store.fail(job.id, "engine_dead", "boom", now=time.time(), owner="a")
    assert store.get(job.id).status == FAILED  # type: ignore[union-attr]
    assert [e.event for e in events(webhooks, job.id)] == [
        "video.in_progress",
        "video.failed",
    ]
    # A requeue at restart is no event; an interrupted job failed at restart is one.
    other, _ = store.create(model="m", prompt="p", request=REQUEST, now=time.time())
    assert store.claim(other.id, "a", now=time.time(), lease_s=30)
    assert store.recover(now=time.time(), requeue=True, owner="a") == [other.id]
    assert store.get(other.id).status == QUEUED  # type: ignore[union-attr]
    assert events(webhooks, other.id) == []
    assert store.claim(other.id, "a", now=time.time(), lease_s=30)
    assert store.recover(now=time.time(), requeue=False, owner="a") == [other.id]
    assert [e.event for e in events(webhooks, other.id)] == ["video.failed"]
    store.close()


def test_a_store_without_the_outbox_is_migrated(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    original = schema.MIGRATIONS
    schema.MIGRATIONS = original[:1]
    try:
        old = JobStore(url)
        job, _ = old.create(model="m", prompt="p", request=REQUEST, now=1.0)
        old.close()
    finally:
        schema.MIGRATIONS = original
    upgraded = JobStore(url)
    assert upgraded.version == 2 and upgraded.get(job.id) is not None
    with upgraded.engine.connect() as connection:
        assert connection.execute(select(schema.webhook_events)).all() == []
    upgraded.close()


# -- the URL policy
# --------------------------------------------------------------------------------------

NAMES = {
    "hooks.example.com": ["93.184.215.14"],
    "db.corp": ["10.1.2.3"],
    "rebind.example.com": ["93.184.215.15"],
    "localhost": ["127.0.0.1", "::1"],
    "mapped.example.com": ["::ffff:10.0.0.1"],
}


def fake_resolver(host: str, port: int) -> list[str]:
    if host in NAMES:
        return NAMES[host]
    return [host]  # an IP literal


POLICY = UrlPolicy(
    ["hooks.example.com", "*.corp", "rebind.example.com", "10.9.9.9:8080"],
    endpoints=["http://10.0.0.5/trusted"],
    resolver=fake_resolver,
)


@pytest.mark.parametrize(
    "url, why",
    [
        ("https://evil.example.net/hook", "not in server.webhooks.allowed_hosts"),
        ("http://10.0.0.1/hook", "not in server.webhooks.allowed_hosts"),
        ("http://127.0.0.1:8080/hook", "not in server.webhooks.allowed_hosts"),
        ("https://db.corp/hook", "not a public address"),
        ("http://10.9.9.9:8081/", "not in server.webhooks.allowed_hosts"),
        ("https://user:pw@hooks.example.com/", "credentials"),
        ("ftp://hooks.example.com/", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("https://hooks.example.com:99999/", "not a valid URL"),
        ("https://hooks.example.com/" + "x" * 3000, "longer than"),
    ],
)
def test_hostile_webhook_urls_are_refused(url: str, why: str) -> None:
    with pytest.raises(WebhookURLError, match=why):
        POLICY.check(url)


def test_a_listed_private_address_pins_the_delivery_to_the_checked_address() -> None:
    target = POLICY.check("https://hooks.example.com/hook?x=1")
    assert target.url == "https://93.184.215.14/hook?x=1"
    assert (target.host_header, target.sni_hostname) == (
        "hooks.example.com",
        "hooks.example.com",
    )
    assert POLICY.check("http://10.9.9.9:8080/h").url == "http://10.9.9.9:8080/h"
    everyone = UrlPolicy(["*", "localhost"], resolver=fake_resolver)
    with pytest.raises(WebhookURLError, match="not a public address"):
        everyone.check("http://mapped.example.com/")  # IPv4-mapped 10.0.0.1
    with pytest.raises(WebhookURLError, match="not a public address"):
        everyone.check("http://[::1]/")
    assert everyone.check("http://localhost:9/").host_header == "localhost:9"
    # A configured endpoint is trusted as it is; any other URL is checked again.
    assert POLICY.target("http://10.0.0.5/trusted").url == "http://10.0.0.5/trusted"


def test_a_name_rebound_to_a_private_address_is_refused_at_delivery() -> None:
    NAMES["rebind.example.com"] = ["93.184.215.15"]
    POLICY.check("https://rebind.example.com/hook")  # public when the job is created
    NAMES["rebind.example.com"] = ["169.254.169.254"]
    try:
        with pytest.raises(WebhookURLError, match="not a public address"):
            POLICY.target("https://rebind.example.com/hook")
    finally:
        NAMES["rebind.example.com"] = ["93.184.215.15"]


def test_secrets_come_from_the_file_or_the_environment_and_are_never_shown(
    tmp_path: Path,
) -> None:
    path = tmp_path / "secrets"
    path.write_text(f"{SECRET}\n\n{NEXT_SECRET}\n")
    assert len(load_secrets(str(path))) == 2
    assert len(load_secrets("", {SECRETS_ENV: f"{SECRET}, {NEXT_SECRET}"})) == 2
    with pytest.raises(ConfigError, match="server.webhooks.secrets_file"):
        load_secrets("", {})
    bad = "whsec_not*base64-but-secret"
    path.write_text(f"{SECRET}\n{bad}\n")
    with pytest.raises(ConfigError) as refused:
        load_secrets(str(path))
    assert "secret 2" in str(refused.value) and bad not in str(refused.value)
    with pytest.raises(ConfigError, match="server.webhooks.secrets_file"):
        load_secrets(str(tmp_path / "missing"))


def test_pending_rows_are_due_and_claimed_once(tmp_path: Path, hooks: Receiver) -> None:
    """The claim is a compare-and-set on the attempt count: of two claims of one read
    event, one wins."""
    store = open_store(tmp_path)
    webhooks = attach(store, config(hooks, endpoints=(hooks.url,)))
    job_id = finish(store)
    (event,) = webhooks.outbox.due(now=time.time(), limit=10)
    assert event.job_id == job_id and event.status == PENDING
    won = webhooks.outbox.claim(event, "a", now=time.time(), claim_s=30)
    assert won is not None and won.attempts == 1
    assert webhooks.outbox.claim(event, "b", now=time.time(), claim_s=30) is None
    assert webhooks.outbox.due(now=time.time(), limit=10) == []
    # Its claim expired (the instance died): due again, for the next attempt.
    assert [e.id for e in webhooks.outbox.due(now=time.time() + 60, limit=10)] == [
        event.id
    ]
    store.close()


def test_delivered_events_of_a_deleted_job_are_purged_and_others_stay(
    tmp_path: Path, hooks: Receiver
) -> None:
    store = open_store(tmp_path)
    webhooks = attach(store, config(hooks, max_attempts=1))
    jobs: dict[str, str] = {}

    async def scenario() -> None:
        for name in ("kept", "gone", "dead"):
            if name == "dead":
                hooks.answer_next("fail")  # its one attempt fails: dead-lettered
            jobs[name] = finish(store)
            await settled(webhooks, jobs[name])
        assert {r.status for r in events(webhooks, jobs["dead"])} == {DEAD}
        assert store.delete(jobs["gone"]) and store.delete(jobs["dead"])

    run(webhooks, scenario)
    assert webhooks.outbox.purge() == 1  # gone's delivered event
    assert [r.status for r in events(webhooks, jobs["kept"])] == [DELIVERED]
    assert events(webhooks, jobs["gone"]) == []
    # A dead letter outlives its job: it can still be seen and retried.
    assert [r.status for r in events(webhooks, jobs["dead"])] == [DEAD]
    store.close()
