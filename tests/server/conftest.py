"""Start the real ``diffserve serve`` process on 127.0.0.1 and a free port (one per test module)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

STARTUP_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A running ``diffserve serve``; ``url`` is its base URL, ``log`` its combined output."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "diffserve.entrypoints.cli", "serve", *args,
               "--host", "127.0.0.1", "--port", str(self.port)]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, path: str, status: int = 200, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + path, timeout=5).status_code == status:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{path} did not answer {status} within {timeout}s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


@pytest.fixture(scope="session")
def server_launcher(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., contextlib.AbstractContextManager]:
    """``with server_launcher(model_dir, *flags, wait_ready=True) as server:`` starts and stops one."""

    @contextlib.contextmanager
    def launch(*args: str, wait_ready: bool = True) -> Iterator[ServerProcess]:
        server = ServerProcess([str(a) for a in args], tmp_path_factory.mktemp("server") / "server.log")
        try:
            if wait_ready:
                server.wait_for("/ready")
            yield server
        finally:
            server.stop()

    return launch


@pytest.fixture(scope="session")
def write_deploy(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    def write(text: str) -> Path:
        path = tmp_path_factory.mktemp("deploy") / "deploy.yaml"
        path.write_text(text)
        return path

    return write


# --- the shared uni server: tiny FLUX, API key, max_queue=1, max_n=3 (one process for all modules) ----
API_KEY = "test-key-123"
MODEL_NAME = "tiny-flux"
UNI_DEPLOY = """
server:
  max_queue: 1
  max_n: 3
  max_steps: 1000
  max_body_bytes: 65536
warmup:
  enabled: true
  height: 64
  width: 64
enforce_eager: true
"""


@pytest.fixture(scope="session")
def uni_server(server_launcher, write_deploy, tiny_flux_dir) -> Iterator[ServerProcess]:
    with server_launcher(tiny_flux_dir, "--deploy-config", write_deploy(UNI_DEPLOY), "--api-key", API_KEY,
                         "--served-model-name", MODEL_NAME, "--default-steps", "2") as proc:
        proc.api_key = API_KEY
        proc.model = MODEL_NAME
        proc.auth = {"Authorization": f"Bearer {API_KEY}"}
        yield proc


@pytest.fixture(scope="session")
def client(uni_server: ServerProcess):
    import openai

    # max_retries=0: the SDK retries 429/5xx by default, which would hide the statuses under test.
    return openai.OpenAI(base_url=uni_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
