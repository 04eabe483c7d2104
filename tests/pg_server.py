"""A throwaway PostgreSQL server for tests: Debian's binaries (``make postgres``
installs them), a new cluster in a temporary directory, listening on 127.0.0.1 only, run
under ``timeout`` so it stops by itself even if the test process dies; as root it runs
as the ``postgres`` user (the server refuses root)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LIFETIME_S = 1200  # the server exits after this however the run ends


def postgres_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def postgres_server() -> Iterator[str]:
    """The server's base URL (``postgresql+psycopg://diffserve@127.0.0.1:PORT``);
    databases are the caller's. Its cluster lives in a directory of its own (pytest's
    are closed to the ``postgres`` user), removed after."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise RuntimeError(
            "PostgreSQL is not installed (make postgres installs Debian's postgresql)"
        )
    root = Path(tempfile.mkdtemp(prefix="diffserve-pg-"))
    data = root / "pgdata"
    data.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [
            *as_user,
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            "diffserve",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    port = _free_port()
    server = subprocess.Popen(
        [
            *as_user,
            "timeout",
            "--signal=INT",
            str(LIFETIME_S),
            str(bin_dir / "postgres"),
            "-D",
            str(data),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-k",
            str(data),
            "-c",
            "fsync=off",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        # An open port is not a ready server: during recovery it accepts and refuses
        # with "the database system is starting up". pg_isready answers 0 only once the
        # server accepts sessions.
        while True:
            ready = subprocess.run(
                [
                    str(bin_dir / "pg_isready"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-t",
                    "1",
                ],
                capture_output=True,
                timeout=10,
            )
            if ready.returncode == 0:
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"postgres did not start: {server.stderr.read().decode()[-2000:]}"
                    if server.stderr
                    else "postgres did not start"
                )
            time.sleep(0.1)
        yield f"postgresql+psycopg://diffserve@127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)
