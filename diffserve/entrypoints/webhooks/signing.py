"""Standard Webhooks signatures (https://www.standardwebhooks.com): every delivery
carries ``webhook-id``, ``webhook-timestamp`` (unix seconds) and ``webhook-signature``,
``v1,`` + base64 of HMAC-SHA256 over ``{id}.{timestamp}.{body}`` keyed with the
base64-decoded part of a ``whsec_`` secret. With two secrets (a rotation), the header
carries both signatures, space-separated: a receiver that knows either verifies.

The secrets come from ``server.webhooks.secrets_file`` (one per line) or, when that key
is empty, from ``DIFFSERVE_WEBHOOK_SECRETS`` (newline- or comma-separated). No message
here ever contains a secret."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from pathlib import Path

from diffserve.errors import ConfigError

SECRETS_ENV = "DIFFSERVE_WEBHOOK_SECRETS"
SECRETS_KEY = "server.webhooks.secrets_file"
PREFIX = "whsec_"
_HINT = (
    f"write one secret per line in the file (or set {SECRETS_ENV}): whsec_ + the "
    'base64 of 24-64 random bytes, e.g. python -c "import base64, os; '
    "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\""
)


def parse_secrets(text: str, where: str) -> tuple[bytes, ...]:
    """The HMAC keys of ``whsec_`` secrets, one per line or comma-separated; a
    ConfigError naming the line (not its content) for a malformed one."""
    keys = []
    for number, item in enumerate(re.split(r"[\n,]", text), start=1):
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        try:
            if not item.startswith(PREFIX):
                raise ValueError
            key = base64.b64decode(item[len(PREFIX) :], validate=True)
        except (ValueError, binascii.Error):
            raise ConfigError(
                f"secret {number} of {where} is not whsec_ + base64",
                path=SECRETS_KEY,
                hint=_HINT,
            ) from None
        if len(key) < 16:
            raise ConfigError(
                f"secret {number} of {where} is shorter than 16 bytes",
                path=SECRETS_KEY,
                hint=_HINT,
            )
        keys.append(key)
    return tuple(keys)


def load_secrets(
    secrets_file: str, environ: Mapping[str, str] | None = None
) -> tuple[bytes, ...]:
    """The signing keys, from ``secrets_file`` or else the environment; a ConfigError
    naming ``server.webhooks.secrets_file`` when there are none."""
    if secrets_file:
        try:
            text = Path(secrets_file).read_text()
        except OSError as exc:
            raise ConfigError(
                f"cannot read {secrets_file}: {exc.strerror or exc}",
                path=SECRETS_KEY,
                hint=_HINT,
            ) from None
        keys = parse_secrets(text, secrets_file)
    else:
        env = os.environ if environ is None else environ
        keys = parse_secrets(env.get(SECRETS_ENV, ""), SECRETS_ENV)
    if not keys:
        raise ConfigError(
            "webhooks are configured (server.webhooks.endpoints or allowed_hosts) but "
            f"there is no signing secret: set {SECRETS_KEY} or {SECRETS_ENV}",
            path=SECRETS_KEY,
            hint=_HINT,
        )
    return keys


class Signer:
    """Signs deliveries with every key it holds (two during a rotation)."""

    def __init__(self, keys: tuple[bytes, ...]) -> None:
        if not keys:
            raise ValueError("a Signer needs at least one key")
        self._keys = keys

    def __repr__(self) -> str:  # never the keys
        return f"Signer({len(self._keys)} key(s))"

    def signature(self, event_id: str, timestamp: int, body: bytes) -> str:
        signed = f"{event_id}.{timestamp}.".encode() + body
        return " ".join(
            "v1,"
            + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            for key in self._keys
        )

    def headers(self, event_id: str, timestamp: int, body: bytes) -> dict[str, str]:
        return {
            "webhook-id": event_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": self.signature(event_id, timestamp, body),
        }
