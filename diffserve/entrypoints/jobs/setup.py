"""Where a server's video jobs live, from its ``server.*`` settings: the state directory
(private to the server's user), the job store's URL (SQLite in it unless
``server.job_store`` names a database) and the artifact directory."""

from __future__ import annotations

import os
from pathlib import Path

from diffserve.config.server_schema import ServerConfig
from diffserve.entrypoints.jobs.artifacts import ArtifactDir
from diffserve.entrypoints.jobs.store import JobStore


def state_root(server: ServerConfig) -> Path:
    """``server.state_dir``, else ``$XDG_STATE_HOME/diffserve``, else
    ``~/.local/state/diffserve``."""
    if server.state_dir:
        return Path(server.state_dir)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "diffserve"


def _private_dir(path: Path) -> Path:
    # Jobs hold prompts and videos: readable by the server's user only
    # (docs/security.md).
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def job_store_url(server: ServerConfig) -> str:
    if server.job_store:
        return server.job_store
    return f"sqlite:///{_private_dir(state_root(server)) / 'jobs.sqlite3'}"


def open_job_store(server: ServerConfig, *, timeout_s: float = 10.0) -> JobStore:
    return JobStore(job_store_url(server), timeout_s=timeout_s)


def open_artifacts(server: ServerConfig) -> ArtifactDir:
    root = (
        Path(server.artifact_dir)
        if server.artifact_dir
        else state_root(server) / "videos"
    )
    return ArtifactDir(_private_dir(root))
