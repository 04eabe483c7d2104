"""Job webhooks through one real ``diffserve serve`` of the tiny Wan on 127.0.0.1 (state
in a temporary directory) and a real receiver (webhook_receiver.py): hostile
``webhook_url``s are 400 naming ``webhook_url`` (JSON and multipart); a receiver that
keeps failing dead-letters the event, visible in ``GET /v1/videos/{id}`` and
``GET /v1/webhooks/events?status=dead``, and ``POST .../retry`` delivers it once the
receiver recovers; and a server SIGKILLed while a delivery hangs, restarted on its port,
delivers the event again with the same ``webhook-id``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import ServerProcess
from video_requests import SHORT
from webhook_receiver import Receiver, receiver, verified

from diffserve.entrypoints.webhooks.signing import SECRETS_ENV

SECRET = "whsec_" + "c2VydmVyIHNpZGUgc2VjcmV0LCAzMiBieXRlcyBsb25n"


@dataclass
class Harness:
    tmp: Path
    model: Path
    hooks: Receiver
    server: ServerProcess | None = None

    def start(self, port: int | None = None) -> ServerProcess:
        host = self.hooks.url.removeprefix("http://")
        (self.tmp / "deploy.yaml").write_text(
            "dtype: float32\nenforce_eager: true\nwarmup:\n  enabled: false\n"
            "server:\n  webhooks:\n"
            f"    allowed_hosts: ['{host}']\n"
            "    max_attempts: 2\n    backoff_s: 0.05\n    backoff_max_s: 0.1\n"
            "    timeout_s: 20\n"
        )
        self.server = ServerProcess(
            [
                str(self.model),
                "--deploy-config",
                str(self.tmp / "deploy.yaml"),
                "--state-dir",
                str(self.tmp / "state"),
                "--served-model-name",
                "tiny-wan",
            ],
            self.tmp / "server.log",
            port=port,
            env={SECRETS_ENV: SECRET},
        )
        self.server.wait_for("/ready")
        return self.server

    def create(self, **extra: Any) -> str:
        assert self.server is not None
        answer = httpx.post(
            self.server.url + "/v1/videos", json={**SHORT, **extra}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["id"]

    def video(self, video_id: str) -> dict:
        assert self.server is not None
        return httpx.get(f"{self.server.url}/v1/videos/{video_id}", timeout=30).json()

    def wait_hooks(self, video_id: str, status: str, timeout: float = 120) -> dict:
        """The video once each of its webhook events is ``status``."""
        deadline = time.monotonic() + timeout
        seen: dict = {}
        while time.monotonic() < deadline:
            seen = self.video(video_id)
            hooks = seen.get("webhooks") or []
            if hooks and all(h["status"] == status for h in hooks):
                return seen
            time.sleep(0.05)
        assert self.server is not None
        raise TimeoutError(f"{video_id}: {seen}\n{self.server.log()[-3000:]}")


@pytest.fixture(scope="module")
def harness(
    tmp_path_factory: pytest.TempPathFactory, tiny_wan_dir: Path
) -> Iterator[Harness]:
    with receiver() as hooks:
        running = Harness(tmp_path_factory.mktemp("webhooks"), tiny_wan_dir, hooks)
        running.start()
        try:
            yield running
        finally:
            assert running.server is not None
            running.server.stop()


def test_hostile_webhook_urls_are_400(harness: Harness) -> None:
    assert harness.server is not None
    own = harness.hooks.url
    for url in (
        "http://10.0.0.1/hook",  # a private address nobody listed
        "http://127.0.0.1:1/hook",  # loopback, but not the listed port
        "https://hooks.example.net/hook",  # not an allowed host
        own.replace("http://", "http://user:pw@") + "/hook",
        own.replace("http://", "ftp://") + "/hook",
    ):
        answer = httpx.post(
            harness.server.url + "/v1/videos",
            json={**SHORT, "webhook_url": url},
            timeout=30,
        )
        assert answer.status_code == 400, (url, answer.text)
        error = answer.json()["error"]
        assert (error["param"], error["code"]) == ("webhook_url", "invalid_webhook_url")
    form = httpx.post(
        harness.server.url + "/v1/videos",
        files={
            "prompt": (None, "a ball"),
            "webhook_url": (None, "http://169.254.169.254/"),
        },
        timeout=30,
    )
    assert form.status_code == 400 and form.json()["error"]["param"] == "webhook_url"
    # A job without a webhook_url has no events
    assert harness.video(harness.create())["webhooks"] == []


def test_a_dead_letter_is_visible_and_retried(harness: Harness) -> None:
    assert harness.server is not None
    hooks = harness.hooks
    hooks.mode = "fail"
    video_id = harness.create(webhook_url=hooks.url + "/dead?token=secret")
    (event,) = harness.wait_hooks(video_id, "dead")["webhooks"]
    assert event["event"] == "video.completed" and event["attempts"] == 2
    assert (event["last_status"], event["last_error"]) == (500, "HTTP 500")
    assert event["url"] == hooks.url + "/dead"  # the query string is not shown
    letters = httpx.get(
        harness.server.url + "/v1/webhooks/events?status=dead", timeout=30
    ).json()
    assert event["id"] in [e["id"] for e in letters["data"]]
    hooks.mode = "ok"
    retried = httpx.post(
        f"{harness.server.url}/v1/webhooks/events/{event['id']}/retry",
        json={},
        timeout=30,
    )
    assert retried.status_code == 200 and retried.json()["attempts"] == 0
    (done,) = harness.wait_hooks(video_id, "delivered")["webhooks"]
    assert done["id"] == event["id"] and done["attempts"] == 1
    again = httpx.post(
        f"{harness.server.url}/v1/webhooks/events/{event['id']}/retry",
        json={},
        timeout=30,
    )
    assert again.status_code == 409
    mine = [d for d in hooks.deliveries if d.id == event["id"]]
    assert len(mine) == 3 and mine[-1].answer == "ok"
    payload = verified(mine[-1], SECRET)
    assert payload["data"]["id"] == video_id
    _events_page_through(harness.server.url + "/v1/webhooks/events")


def _events_page_through(url: str) -> None:
    """The events list pages by its ``after`` cursor, one event a page, to the same
    ids as one page; a cursor of another shape or of no event is a 400 naming it."""
    whole = httpx.get(url, params={"limit": 100}, timeout=30).json()["data"]
    assert whole
    paged: list[str] = []
    after: dict[str, str] = {}
    for _ in range(len(whole)):  # a cursor that did not move would page forever
        page = httpx.get(url, params={"limit": 1, **after}, timeout=30).json()
        paged += [event["id"] for event in page["data"]]
        if not page["has_more"]:
            break
        after = {"after": page["last_id"]}
    assert paged == [event["id"] for event in whole]
    for cursor, message in (
        ("vid_0", "is not an event id"),
        ("evt_" + "0" * 32, "no such event"),
    ):
        answer = httpx.get(url, params={"after": cursor}, timeout=30)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "after" and message in error["message"], error


def test_a_server_killed_mid_delivery_delivers_again_after_restart(
    harness: Harness,
) -> None:
    server = harness.server
    assert server is not None
    hooks = harness.hooks
    before = len(hooks.deliveries)
    hooks.answer_next("hang")
    video_id = harness.create(webhook_url=hooks.url + "/killed")
    hung = hooks.wait_for(before + 1, timeout=120)[-1]
    assert hung.answer == "hang"
    server.kill()  # mid-delivery: the row stays claimed by this instance
    harness.start(port=server.port)  # its restart releases that claim at once
    (event,) = harness.wait_hooks(video_id, "delivered", timeout=60)["webhooks"]
    assert event["id"] == hung.id and event["attempts"] == 2
    again = [d for d in hooks.deliveries if d.id == hung.id]
    assert [d.answer for d in again] == ["hang", "ok"]
    for delivery in again:
        assert verified(delivery, SECRET)["data"]["id"] == video_id
