"""A real ``diffserve serve`` process on 127.0.0.1 and a free port, for the server and
adversarial tests."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import programs

STARTUP_TIMEOUT_S = 180.0


# Below the kernel's ephemeral range (32768+ by default) and above Ray's worker ports
# (10002-19999): a port the kernel hands to another process's bind(0) or connect() - Ray
# opens many while a test server starts - can never be this one.
_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port on 127.0.0.1 that is free now, drawn from ``_PORTS``."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORTS} on 127.0.0.1")


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
