"""``server.webhooks.*``: where job events are delivered, how they are signed and how
delivery is retried (docs/webhooks.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from diffserve.config import canonical as c
from diffserve.config import structured as sv
from diffserve.config.options import opt
from diffserve.errors import ConfigError


def normalize_url_list(value: Any) -> tuple[str, ...]:
    """http(s) URLs, a list or comma-separated; duplicates dropped."""
    hint = 'write URLs like "https://hooks.example.com/diffserve"'
    urls = sv.comma_list(value, "a URL list", hint)
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{url!r} is not an http(s) URL", hint=hint)
    return tuple(dict.fromkeys(urls))


@dataclass(frozen=True)
class WebhooksConfig:
    """Signed job webhooks delivered from a durable outbox in the job store."""

    endpoints: tuple[str, ...] = opt(
        (),
        "URLs every video job event is delivered to (a list or comma-separated; "
        "empty: none)",
        normalize_url_list,
        kind="list",
    )
    allowed_hosts: tuple[str, ...] = opt(
        (),
        "hosts (host or host:port) a request's own webhook_url may name; empty: "
        "per-request webhook_url is refused",
        sv.normalize_host_list,
        kind="list",
    )
    secrets_file: str = opt(
        "",
        "file holding the signing secret(s), one per line (whsec_ + base64); two "
        "lines sign with both while a secret is rotated",
        sv.normalize_optional_dir,
    )
    max_attempts: int = opt(
        8,
        "delivery attempts of one event before it is dead-lettered",
        c.int_normalizer(1),
        kind="int",
    )
    backoff_s: float = opt(
        1.0,
        "seconds before the first retry; doubled each attempt, with jitter",
        c.float_normalizer(0.01, 3600.0),
        kind="float",
    )
    backoff_max_s: float = opt(
        300.0,
        "longest wait between two attempts",
        c.float_normalizer(0.01, 86400.0),
        kind="float",
    )
    timeout_s: float = opt(
        10.0,
        "seconds one delivery attempt may take (connect, send, answer)",
        c.float_normalizer(0.1, 600.0),
        kind="float",
    )
    in_progress_events: bool = opt(
        False,
        "also send video.in_progress when a job starts running (off: only "
        "video.completed and video.failed)",
        c.normalize_bool,
        kind="bool",
    )
