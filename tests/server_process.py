"""A real ``diffserve serve`` process on 127.0.0.1 and a free port, for the server and
adversarial tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import programs

STARTUP_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A running ``diffserve serve``; ``url`` is its base URL, ``log`` its combined
    output."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        # A restarted server keeps its port (and so its instance name)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        # Offline unless the test says otherwise (``env``: the hub-download tests point
        # HF_ENDPOINT at a local hub). Video jobs go to the server's own state directory
        # (beside its log, so a restart finds them), never ~/.local.
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "XDG_STATE_HOME": str(log_path.parent / "state"),
            **(env or {}),
        }
        # A process of its own, as `diffserve serve` from a shell; a restart appends to
        # the same log.
        self.proc = programs.start(
            "diffserve.entrypoints.cli",
            ["serve", *args, "--host", "127.0.0.1", "--port", str(self.port)],
            env,
            log_path,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(
        self, path: str, status: int = 200, timeout: float = STARTUP_TIMEOUT_S
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}:\n{self.log()}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + path, timeout=5).status_code == status:
                    return
            time.sleep(0.05)
        raise TimeoutError(
            f"{path} did not answer {status} within {timeout}s:\n{self.log()}"
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown runs (a crash)."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
