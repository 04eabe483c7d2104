"""A ``diffserve serve`` subprocess for the HTTP measurements: start, wait for /ready,
stop."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import subprocess_env

READY_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def diffserve_cmd() -> list[str]:
    """The ``diffserve`` console script of the interpreter running the benchmark (the
    venv's, what a user runs), not whatever is on PATH; ``python -m`` when the script is
    not installed."""
    script = Path(sys.executable).with_name("diffserve")
    return (
        [str(script)]
        if script.exists()
        else [sys.executable, "-m", "diffserve.entrypoints.cli"]
    )


class Server:
    """``with Server(model, flags) as srv:`` -> ``srv.base_url``, ``srv.ready_s``
    (process start to 200 on /ready)."""

    def __init__(
        self, model: Path, flags: list[str], *, log: Path | None = None
    ) -> None:
        self.model = model
        self.flags = flags
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.ready_s = float("nan")

    def __enter__(self) -> Server:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        cmd = [
            *diffserve_cmd(),
            "serve",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            self.model.name,
            *self.flags,
        ]
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=subprocess_env(),
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        import httpx

        assert self.proc is not None
        deadline = self.started + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    "diffserve serve exited "
                    f"with {self.proc.returncode}{self._log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/ready", timeout=1.0).status_code == 200:
                    self.ready_s = time.perf_counter() - self.started
                    return self.ready_s
            time.sleep(0.05)
        raise TimeoutError(
            f"diffserve serve not ready after {timeout:.0f}s{self._log_tail()}"
        )

    def peak_rss_mib(self) -> float:
        """High-water RSS of the server process (VmHWM); mp workers are separate
        processes, not included."""
        assert self.proc is not None
        with (
            contextlib.suppress(OSError),
            open(f"/proc/{self.proc.pid}/status", encoding="utf-8") as fh,
        ):
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # The server runs in its own session, so its mp workers go with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _log_tail(self) -> str:
        if self.log and self.log.exists():
            lines = self.log.read_text(errors="replace").strip().splitlines()[-5:]
            return ": " + " | ".join(lines)
        return ""
