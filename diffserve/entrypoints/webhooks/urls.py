"""Which URLs a job's webhook may be delivered to: a request's own ``webhook_url`` is a
server-side request to wherever the client says, so it is held to
``server.webhooks.allowed_hosts`` (SSRF): http(s) only, no credentials in it, its host
(or host:port) listed, and an address that is not public (private, loopback,
link-local, reserved, multicast, unspecified) only when the matching entry names it
explicitly (that IP literal, or ``localhost`` for loopback). Checked when the job is
created (a 400) and again at each delivery, which then connects to the very address it
checked (a name that resolves elsewhere by then, DNS rebinding, gets no request).
The server's own ``endpoints`` are trusted as configured."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]
MAX_URL_CHARS = 2048


class WebhookURLError(ValueError):
    """A webhook URL this server will not call; the message says why."""


def split_host(value: str) -> tuple[str, str | None]:
    """``"Example.com:8000"`` -> ``("example.com", "8000")``; IPv6 literals lose their
    brackets (as ``server.allowed_hosts`` entries are read, ``openai/hosts.py``)."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if value.count(":") == 1:
        host, port = value.split(":")
        return host, port
    return value, None


def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (blocking: call it from a worker thread)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


@dataclass(frozen=True)
class Target:
    """Where one delivery goes: ``url`` (with the checked address in place of the name,
    when pinned), the ``Host`` header and TLS server name it must carry."""

    url: str
    host_header: str | None = None
    sni_hostname: str | None = None


class UrlPolicy:
    def __init__(
        self,
        allowed_hosts: Sequence[str],
        endpoints: Sequence[str] = (),
        resolver: Resolver = resolve,
    ) -> None:
        self.entries = [split_host(entry) for entry in allowed_hosts if entry.strip()]
        self.endpoints = frozenset(endpoints)
        self.resolver = resolver

    def check(self, url: str) -> Target:
        """The target of a request's ``webhook_url``, or WebhookURLError. Blocks
        (resolves the host)."""
        if len(url) > MAX_URL_CHARS:
            raise WebhookURLError(f"webhook_url is longer than {MAX_URL_CHARS} chars")
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise WebhookURLError("webhook_url is not a valid URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WebhookURLError("webhook_url must be an http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            raise WebhookURLError("webhook_url must not carry credentials (user@)")
        host = parts.hostname.lower().rstrip(".")
        if not self.entries:
            raise WebhookURLError(
                "this server accepts no webhook_url "
                "(server.webhooks.allowed_hosts is empty)"
            )
        entries = self._entries(host, str(port))
        if not entries:
            raise WebhookURLError(
                f"webhook_url's host {host}:{port} is not in "
                "server.webhooks.allowed_hosts"
            )
        try:
            addresses = [ipaddress.ip_address(a) for a in self.resolver(host, port)]
        except (OSError, ValueError) as exc:
            raise WebhookURLError(
                f"webhook_url's host {host} does not resolve: {exc}"
            ) from None
        if not addresses:
            raise WebhookURLError(f"webhook_url's host {host} does not resolve")
        hidden = [a for a in addresses if not _public(a)]
        if hidden and not any(_names(entry, hidden) for entry in entries):
            raise WebhookURLError(
                f"webhook_url's host {host} resolves to {hidden[0]}, not a public "
                "address; only an allowed_hosts entry naming that address (or "
                "localhost) admits it"
            )
        address = addresses[0]
        literal = f"[{address}]" if address.version == 6 else str(address)
        netloc = f"{literal}:{parts.port}" if parts.port else literal
        return Target(
            url=urlunsplit(parts._replace(netloc=netloc)),
            host_header=f"{host}:{parts.port}" if parts.port else host,
            sni_hostname=host if parts.scheme == "https" else None,
        )

    def target(self, url: str) -> Target:
        """Where a delivery to ``url`` goes now: a configured endpoint as it is,
        any other URL checked again (WebhookURLError)."""
        if url in self.endpoints:
            return Target(url=url)
        return self.check(url)

    def _entries(self, host: str, port: str) -> list[str]:
        """The allowed_hosts entries ``host:port`` matches (their host parts)."""
        found = []
        for entry_host, entry_port in self.entries:
            if entry_port is not None and entry_port != port:
                continue
            # "*.corp" matches "a.corp" and "a.b.corp", not "corp" nor "evilcorp".
            wildcard = entry_host.startswith("*.") and host.endswith(entry_host[1:])
            if entry_host in ("*", host) or wildcard:
                found.append(entry_host)
        return found


def _names(entry: str, addresses: list[Address]) -> bool:
    """Whether the allowed_hosts entry names these non-public addresses explicitly."""
    if entry == "localhost":
        return all(a.is_loopback for a in addresses)
    try:
        literal = ipaddress.ip_address(entry)
    except ValueError:
        return False  # a name or a wildcard never admits a private address
    return all(a == literal for a in addresses)
