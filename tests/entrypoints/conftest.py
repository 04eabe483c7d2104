"""Fixtures that start the real ``diffserve serve`` process
(``server_process.ServerProcess``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_process import ServerProcess


@pytest.fixture(scope="session")
def server_launcher(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., contextlib.AbstractContextManager]:
    """``with server_launcher(model_dir, *flags, wait_ready=True) as server:`` starts
    and stops one."""

    @contextlib.contextmanager
    def launch(*args: str, wait_ready: bool = True) -> Iterator[ServerProcess]:
        server = ServerProcess(
            [str(a) for a in args], tmp_path_factory.mktemp("server") / "server.log"
        )
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


# --- the shared uni server: tiny FLUX, API key, max_queue=1, max_n=3 (one process for
# all modules) ----
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
    with server_launcher(
        tiny_flux_dir,
        "--deploy-config",
        write_deploy(UNI_DEPLOY),
        "--api-key",
        API_KEY,
        "--served-model-name",
        MODEL_NAME,
        "--default-steps",
        "2",
    ) as proc:
        proc.api_key = API_KEY
        proc.model = MODEL_NAME
        proc.auth = {"Authorization": f"Bearer {API_KEY}"}
        yield proc


@pytest.fixture(scope="session")
def client(uni_server: ServerProcess):
    import openai

    # max_retries=0: the SDK retries 429/5xx by default, which would hide the statuses
    # under test.
    return openai.OpenAI(
        base_url=uni_server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120
    )
