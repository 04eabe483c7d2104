"""Where ``diffserve serve`` takes its API key from: ``--api-key``, ``--api-key-file``
or ``DIFFSERVE_API_KEY``.

Exactly one source may be set. Two sources are refused instead of ranked: with two keys
in play an operator could believe a key is in force that is not (a stale variable
shadowed by a flag, or the reverse), and a server that refuses to start says so at once.
A key on the command line is visible in the process list; the file and the variable are
not.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from diffserve.errors import ConfigError

API_KEY_ENV = "DIFFSERVE_API_KEY"


def resolve_api_key(
    flag: str | None, file: str | None, env: Mapping[str, str]
) -> str | None:
    """The API key from the one source given, or None when none is (no authentication).

    Raises ``ConfigError`` for two or more sources, an unreadable file, or an empty
    key."""
    env_value = env.get(API_KEY_ENV)
    given = {
        name: value
        for name, value in (
            ("--api-key", flag),
            ("--api-key-file", file),
            (API_KEY_ENV, env_value),
        )
        if value is not None
    }
    if len(given) > 1:
        raise ConfigError(
            f"the API key is given by {' and '.join(given)}; give exactly one source",
            hint=f"unset {API_KEY_ENV} or drop the flag",
        )
    if not given:
        return None
    ((source, value),) = given.items()
    if source == "--api-key-file":
        try:
            value = Path(value).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the API key file {file!r}: {exc}") from exc
    if not value.strip():
        raise ConfigError(f"the API key from {source} is empty")
    return value.strip()
