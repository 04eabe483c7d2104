"""The key this process signs its outputs with, from ``server.provenance``: the
``key_file`` given, else ``<state_dir>/provenance-ed25519.pem`` (made on first use).
Each key file is read once per process.

``diffserve serve`` loads its server's key at startup (a bad key fails there, not on the
first request); the images API and the video job runner sign with the same key.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from diffserve.config.server_schema import ServerConfig
from diffserve.provenance.keys import DEFAULT_KEY_NAME, Signer, load_signer


def state_root(server: ServerConfig) -> Path:
    """The same directory as ``jobs/setup.py:state_root`` (that module imports the
    job store, and so SQLAlchemy: too slow to load for ``diffserve generate``)."""
    if server.state_dir:
        return Path(server.state_dir)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "diffserve"


def key_path(server: ServerConfig) -> tuple[Path, bool]:
    """``(path, create)``: a key_file given must exist; the default one is made."""
    if server.provenance.key_file:
        return Path(server.provenance.key_file), False
    return state_root(server) / DEFAULT_KEY_NAME, True


def signer_for(server: ServerConfig) -> Signer | None:
    """The signer of ``server``'s outputs; None when provenance is off."""
    if not server.provenance.enabled:
        return None
    path, create = key_path(server)
    return _load(str(path.resolve()), create)


@functools.lru_cache(maxsize=8)
def _load(path: str, create: bool) -> Signer:
    return load_signer(path, create=create)
