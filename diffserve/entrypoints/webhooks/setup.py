"""A server's webhooks (``server.webhooks.*``, docs/webhooks.md), built from its
config: the secrets and signer, the URL policy, the event writer the job store calls in
its status-change transactions, the outbox and its dispatcher."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from diffserve.config.webhooks_schema import WebhooksConfig
from diffserve.entrypoints.jobs.outbox import EventWriter, Outbox, WebhookEvent
from diffserve.entrypoints.jobs.store import Job, JobStore
from diffserve.entrypoints.webhooks.dispatcher import Dispatcher, DispatchSettings
from diffserve.entrypoints.webhooks.signing import Signer, load_secrets
from diffserve.entrypoints.webhooks.urls import Target, UrlPolicy


class Webhooks:
    def __init__(
        self,
        store: JobStore,
        config: WebhooksConfig,
        *,
        owner: str,
        render: Callable[[Job], dict[str, Any]],
        on_outcome: Callable[[str], None] | None = None,
        environ: Mapping[str, str] | None = None,
        poll_s: float = 0.5,
    ) -> None:
        """Attaches itself to ``store`` (its status changes write events from now
        on); a ConfigError when there is no signing secret."""
        self.config = config
        self.policy = UrlPolicy(config.allowed_hosts, config.endpoints)
        self.outbox = Outbox(store.engine)
        self.dispatcher = Dispatcher(
            self.outbox,
            Signer(load_secrets(config.secrets_file, environ)),
            self.policy,
            DispatchSettings(
                owner=owner,
                max_attempts=config.max_attempts,
                backoff_s=config.backoff_s,
                backoff_max_s=config.backoff_max_s,
                timeout_s=config.timeout_s,
                poll_s=poll_s,
            ),
            on_outcome,
        )
        self.writer = EventWriter(
            config.endpoints,
            render,
            in_progress=config.in_progress_events,
            on_commit=self.dispatcher.notify,
        )
        store.events = self.writer

    async def start(self) -> None:
        await self.dispatcher.start()

    async def stop(self) -> None:
        await self.dispatcher.stop()

    def check_url(self, url: str) -> Target:
        """A request's ``webhook_url``: its target, or WebhookURLError (blocks: it
        resolves the host)."""
        return self.policy.check(url)

    def for_job(self, job_id: str) -> list[WebhookEvent]:
        return self.outbox.for_job(job_id)

    def retry(self, event_id: str) -> bool:
        """A dead event delivered again (attempts from zero); False if not dead."""
        retried = self.outbox.retry(event_id, now=time.time())
        if retried:
            self.dispatcher.notify()
        return retried


def configured(config: WebhooksConfig) -> bool:
    """Whether this server has webhooks at all (endpoints, or hosts a request's own
    ``webhook_url`` may name)."""
    return bool(config.endpoints or config.allowed_hosts)
