"""Delivers the webhook outbox (``outbox.py``): polls due events, claims one attempt at
a time with a conditional UPDATE (the row count decides which instance makes it), POSTs
the event's fixed payload, signed, without following redirects, and records the outcome:
``delivered`` on a 2xx, else due again after a full-jitter exponential backoff, or
``dead`` after ``max_attempts``. An instance killed mid-delivery leaves a claim that
expires (or that its restart releases at once): the event is delivered again with the
same id, so receivers deduplicate on ``webhook-id``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from diffserve.entrypoints.jobs.outbox import Outbox, WebhookEvent
from diffserve.entrypoints.jobs.wakeup import wait_awake
from diffserve.entrypoints.webhooks.signing import Signer
from diffserve.entrypoints.webhooks.urls import UrlPolicy, WebhookURLError
from diffserve.logging import get_logger

logger = get_logger(__name__)

# Outcomes of an attempt, as the metric counts them.
DELIVERED, RETRY, DEAD = "delivered", "retry", "dead"
USER_AGENT = "diffserve-webhooks"
# How often the delivered events of deleted or expired jobs are deleted (the outbox
# would grow with every job otherwise).
PURGE_INTERVAL_S = 60.0


@dataclass(frozen=True)
class DispatchSettings:
    owner: str  # this instance's name in the claims (stable across its restarts)
    max_attempts: int = 8
    backoff_s: float = 1.0
    backoff_max_s: float = 300.0
    timeout_s: float = 10.0
    poll_s: float = 0.5
    concurrency: int = 8  # attempts in flight at once
    # A claim outlives the attempt's timeout by this much before another instance
    # takes the event over.
    claim_margin_s: float = 5.0

    def backoff(self, attempts: int) -> float:
        """Full jitter: uniform in [0, min(max, base * 2^(attempts - 1)))."""
        ceiling = min(self.backoff_max_s, self.backoff_s * 2 ** min(attempts - 1, 60))
        return random.uniform(0, ceiling)


class Dispatcher:
    def __init__(
        self,
        outbox: Outbox,
        signer: Signer,
        policy: UrlPolicy,
        settings: DispatchSettings,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        self.outbox = outbox
        self.signer = signer
        self.policy = policy
        self.settings = settings
        self.on_outcome = on_outcome
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._purged = 0.0  # when the delivered events of gone jobs were last deleted

    # -- life
    # ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Release this instance's claims left by its previous run, then deliver in
        the background."""
        self._loop = asyncio.get_running_loop()
        # No proxies from the environment: the address checked is the one connected to.
        self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        released = await asyncio.to_thread(
            self.outbox.release, self.settings.owner, now=time.time()
        )
        if released:
            logger.warning(
                "%d webhook event(s) were being delivered when this instance stopped; "
                "delivering them again",
                released,
            )
        self._task = asyncio.create_task(self._run(), name="diffserve-webhooks")

    async def stop(self) -> None:
        """Stop delivering; an attempt cut short stays claimed by this instance, due
        again at its restart or when its claim expires."""
        tasks = [t for t in (self._task, *self._inflight) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
        # The attempts cut short are due now: another instance need not wait for
        # their claims to expire. (A crash skips this; the restart does it.)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(
                self.outbox.release, self.settings.owner, now=time.time()
            )

    def notify(self) -> None:
        """Events were written (any thread): look now, not at the next poll."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon_threadsafe(self._wake.set)

    # -- claiming
    # ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self.dispatch()
            except Exception as exc:  # noqa: BLE001 - a store outage must not end the loop; it retries
                logger.error("webhook dispatch: %s: %s", type(exc).__name__, exc)
            await wait_awake(self._wake, self.settings.poll_s)

    async def dispatch(self) -> int:
        """Claim the due events there is room for and start delivering them; how many
        were claimed."""
        settings = self.settings
        now = time.time()
        await asyncio.to_thread(
            self.outbox.bury, now=now, max_attempts=settings.max_attempts
        )
        if now - self._purged >= PURGE_INTERVAL_S:
            self._purged = now
            await asyncio.to_thread(self.outbox.purge)
        room = settings.concurrency - len(self._inflight)
        if room <= 0:
            return 0
        claimed = 0
        for event in await asyncio.to_thread(self.outbox.due, now=now, limit=room):
            mine = await asyncio.to_thread(
                self.outbox.claim,
                event,
                settings.owner,
                now=time.time(),
                claim_s=settings.timeout_s + settings.claim_margin_s,
            )
            if mine is None:
                continue  # another instance took this attempt
            claimed += 1
            task = asyncio.create_task(self._deliver(mine), name=f"webhook-{mine.id}")
            self._inflight.add(task)
            task.add_done_callback(self._done)
        return claimed

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._wake.set()  # room for another

    async def idle(self) -> None:
        """Wait for the attempts in flight (tests)."""
        while self._inflight:
            await asyncio.gather(*list(self._inflight), return_exceptions=True)

    # -- one attempt
    # ----------------------------------------------------------------------------------

    async def _deliver(self, event: WebhookEvent) -> None:
        try:
            await self._attempt(event)
        except Exception as exc:  # noqa: BLE001 - the store failed: the claim expires and the event is due again
            logger.error(
                "webhook %s: could not record attempt %d: %s: %s",
                event.id,
                event.attempts,
                type(exc).__name__,
                exc,
            )

    async def _attempt(self, event: WebhookEvent) -> None:
        status, error = await self._post(event)
        if error is None and status is not None:
            await asyncio.to_thread(
                self.outbox.delivered,
                event,
                self.settings.owner,
                now=time.time(),
                status_code=status,
            )
            self._count(DELIVERED)
            return
        last = event.attempts >= self.settings.max_attempts
        retry_at = None if last else time.time() + self.settings.backoff(event.attempts)
        await asyncio.to_thread(
            self.outbox.failed,
            event,
            self.settings.owner,
            error=error or "",
            status_code=status,
            retry_at=retry_at,
        )
        self._count(DEAD if last else RETRY)
        logger.log(
            logging.WARNING if last else logging.INFO,
            "webhook %s (%s, job %s) attempt %d failed: %s%s",
            event.id,
            event.event,
            event.job_id,
            event.attempts,
            error,
            "; dead-lettered" if last else "",
        )

    async def _post(self, event: WebhookEvent) -> tuple[int | None, str | None]:
        """The receiver's HTTP status and, unless it was a 2xx, why the attempt
        failed."""
        assert self._client is not None
        timeout = self.settings.timeout_s
        try:
            # One bound for the whole attempt (resolution, connect, send, answer): the
            # claim expires soon after, and another instance may take over.
            async with asyncio.timeout(timeout):
                target = await asyncio.to_thread(self.policy.target, event.url)
                body = event.payload.encode()
                headers = self.signer.headers(event.id, int(time.time()), body)
                headers.update(
                    {"content-type": "application/json", "user-agent": USER_AGENT}
                )
                if target.host_header is not None:
                    headers["host"] = target.host_header
                extensions = (
                    {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
                )
                response = await self._client.post(
                    target.url,
                    content=body,
                    headers=headers,
                    timeout=timeout,
                    extensions=extensions,
                )
        except WebhookURLError as exc:
            return None, f"refused: {exc}"
        except (TimeoutError, httpx.TimeoutException):
            return None, f"timed out after {timeout:g} s"
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"
        code = response.status_code
        if 200 <= code < 300:
            return code, None
        if 300 <= code < 400:
            where = response.headers.get("location", "")[:200]
            return code, f"HTTP {code}: redirect not followed (to {where!r})"
        return code, f"HTTP {code}"

    def _count(self, outcome: str) -> None:
        if self.on_outcome is not None:
            self.on_outcome(outcome)
