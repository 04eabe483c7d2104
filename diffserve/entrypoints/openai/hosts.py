"""``server.allowed_hosts``: which ``Host`` header values this server answers.

A browser page on an attacker's domain can resolve that domain to 127.0.0.1 (DNS
rebinding) and then talk to a local server as same-origin; the Host header it sends
still names the attacker's domain, so an allow-list of the names the server is really
reached by defeats it.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_host(value: str) -> tuple[str, str | None]:
    """``"Example.com:8000"`` -> ``("example.com", "8000")``; IPv6 literals keep their
    brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, None
        rest = value[end + 1 :]
        return value[: end + 1], rest[1:] if rest.startswith(":") else None
    if value.count(":") == 1:
        host, port = value.split(":")
        return host, port
    return value, None


class HostAllowList:
    """Entries are ``name``, ``name:port``, ``*.suffix`` or ``*``; an entry without a
    port matches any port."""

    def __init__(self, allowed: Sequence[str]) -> None:
        self.entries = [split_host(entry) for entry in allowed if entry.strip()]

    def __bool__(self) -> bool:
        return bool(self.entries)

    def allows(self, header: str | None) -> bool:
        if not self.entries:
            return True
        if not header:
            return False
        host, port = split_host(header)
        for entry_host, entry_port in self.entries:
            if entry_port is not None and entry_port != port:
                continue
            if entry_host == "*" or entry_host == host:
                return True
            # "*.corp" matches "a.corp" and "a.b.corp", not "corp" itself nor
            # "evilcorp".
            if entry_host.startswith("*.") and host.endswith(entry_host[1:]):
                return True
        return False
