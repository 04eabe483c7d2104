"""Hugging Face hub stand-ins for the hub-id tests: a cache laid out on disk as
huggingface_hub lays it out, and a hub HTTP server on 127.0.0.1 serving the file API for
local folders (set ``HF_ENDPOINT`` to its url).

The server answers what ``huggingface_hub`` asks: model info
(``/api/models/{repo}/revision/{rev}``), the recursive file tree, and ``HEAD``/``GET``
of ``/{repo}/resolve/{rev}/{file}`` with the commit and ETag headers; gated and unknown
repositories get the hub's error codes. Every request is logged (``requests``).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def commit_of(label: str) -> str:
    """A 40-hex commit id (deterministic per label)."""
    return hashlib.sha1(label.encode()).hexdigest()


def repo_files(folder: Path) -> dict[str, Path]:
    return {
        p.relative_to(folder).as_posix(): p
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def lay_out_cache(
    cache: Path,
    repo_id: str,
    folder: Path,
    commit: str,
    refs: tuple[str, ...] = ("main",),
) -> Path:
    """Put ``folder`` in the hub cache at ``cache`` as snapshot ``commit`` (blobs +
    relative symlinks, refs)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for name, path in repo_files(folder).items():
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@dataclass
class FakeHub:
    """Repositories served (``repos[repo_id] = (commit, folder)``), gated ids, and the
    request log."""

    repos: dict[str, tuple[str, Path]] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""

    def downloaded(self, repo_id: str) -> list[str]:
        """Files whose content was fetched (GET of a resolve URL) for ``repo_id``."""
        prefix = f"/{repo_id}/resolve/"
        return sorted(
            {
                path[len(prefix) :].split("/", 1)[1]
                for method, path in self.requests
                if method == "GET" and path.startswith(prefix)
            }
        )


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: the log is hub.requests
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _send(
            self, status: int, headers: dict[str, str], data: bytes, body: bool
        ) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _error(self, status: int, code: str, body: bool) -> None:
            self._send(
                status,
                {"X-Error-Code": code, "Content-Type": "application/json"},
                json.dumps({"error": code}).encode(),
                body,
            )

        def _repo(self, parts: list[str], body: bool) -> tuple[str, str, Path] | None:
            repo_id = "/".join(parts[:2])
            if repo_id in hub.gated:
                self._error(403, "GatedRepo", body)
                return None
            if repo_id not in hub.repos:
                self._error(404, "RepoNotFound", body)
                return None
            commit, folder = hub.repos[repo_id]
            return repo_id, commit, folder

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append((self.command, path))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"]:
                found = self._repo(parts[2:], body)
                if found is None:
                    return
                repo_id, commit, folder = found
                rest = parts[4:]
                files = repo_files(folder)
                if rest[:1] == ["revision"]:
                    doc = {
                        "id": repo_id,
                        "sha": commit,
                        "siblings": [{"rfilename": f} for f in files],
                    }
                elif rest[:1] == ["tree"]:
                    doc = [
                        {
                            "type": "file",
                            "path": f,
                            "size": p.stat().st_size,
                            "oid": hashlib.sha1(p.read_bytes()).hexdigest(),
                        }
                        for f, p in files.items()
                    ]
                else:
                    self._error(404, "EntryNotFound", body)
                    return
                if len(rest) > 1 and rest[1] not in ("main", commit):
                    self._error(404, "RevisionNotFound", body)
                    return
                self._send(
                    200,
                    {"Content-Type": "application/json"},
                    json.dumps(doc).encode(),
                    body,
                )
                return
            found = self._repo(parts, body)
            if found is None:
                return
            repo_id, commit, folder = found
            if parts[2:3] != ["resolve"] or len(parts) < 5:
                self._error(404, "EntryNotFound", body)
                return
            if parts[3] not in ("main", commit):
                self._error(404, "RevisionNotFound", body)
                return
            file = repo_files(folder).get("/".join(parts[4:]))
            if file is None:
                self._error(404, "EntryNotFound", body)
                return
            data = file.read_bytes()
            self._send(
                200,
                {
                    "X-Repo-Commit": commit,
                    "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                    "Content-Type": "application/octet-stream",
                },
                data,
                body,
            )

    return Handler


@contextmanager
def serve_hub(hub: FakeHub, timeout_s: float = 300.0) -> Iterator[FakeHub]:
    """Run the hub on 127.0.0.1 (a free port) until the block ends or ``timeout_s``
    passes."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stopper = threading.Timer(timeout_s, server.shutdown)
    stopper.daemon = True
    stopper.start()
    try:
        yield hub
    finally:
        stopper.cancel()
        server.shutdown()
        server.server_close()
