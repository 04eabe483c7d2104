"""Constants, launch and probes shared by the adversarial tests (a module with a unique
name: two conftest.py files cannot both be imported as ``conftest`` in one session)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
from server_process import ServerProcess

API_KEY = "adversarial-key-1"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL_NAME = "tiny-flux"
GEN = "/v1/images/generations"

# Small limits so that every request the fuzzer can make valid is cheap, a short body
# deadline for the slow clients, and a Host allow-list. max_pixels (64x64) is below the
# tiny model's default size (128x128), so a request that omits size is over it.
HARDENED_DEPLOY = """
server:
  max_queue: 2
  max_n: 2
  max_steps: 4
  max_pixels: 4096
  max_prompt_chars: 200
  max_body_bytes: 65536
  body_timeout_s: 2
  max_connections: 240
  allowed_hosts: "127.0.0.1,localhost"
warmup:
  enabled: true
  height: 32
  width: 32
enforce_eager: true
"""

# Long runs allowed (to drop requests mid-denoise), a queue of 2 (to overload it).
BUSY_DEPLOY = """
server:
  max_queue: 2
  max_n: 4
  max_steps: 1000
  max_pixels: 65536
warmup:
  enabled: true
  height: 32
  width: 32
enforce_eager: true
"""


@contextlib.contextmanager
def launch(
    log_dir: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """Start a server (``env`` is set for the child only) and wait until it is
    warmed."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        server = ServerProcess([str(a) for a in args], log_dir / "server.log")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        server.wait_for("/ready")
        yield server
    finally:
        server.stop()


def write(tmp: Path, text: str) -> Path:
    path = tmp / "deploy.yaml"
    path.write_text(text)
    return path


# --- probes
# --------------------------------------------------------------------------------------
def rss_mib(server: ServerProcess) -> float:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def open_fds(server: ServerProcess) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def threads(server: ServerProcess) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/task"))


def scrape(server: ServerProcess) -> dict[str, float]:
    """``/metrics`` as ``{"name{labels}": value}`` (one entry per series)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def metric(samples: dict[str, float], key: str) -> float:
    return samples.get(key, 0.0)


def assert_clean_log(server: ServerProcess) -> None:
    log = server.log()
    assert "Traceback" not in log, log[-4000:]


def generate_ok(server: ServerProcess, **fields: object) -> dict:
    body = {
        "prompt": "still alive",
        "size": "32x32",
        "num_inference_steps": 1,
        **fields,
    }
    resp = httpx.post(server.url + GEN, json=body, headers=AUTH, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()
