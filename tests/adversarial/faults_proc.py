"""Process helpers for the adversarial tests: children from /proc (psutil is not a
dependency)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from background import wait_until
from procs import pid_alive, worker_children

__all__ = [
    "HERE",
    "deploy",
    "kill_all",
    "pid_alive",
    "wait_gone",
    "wait_until",
    "worker_children",
]

HERE = Path(__file__).resolve().parent


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive; returns the survivors."""
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout)
    return [p for p in pids if pid_alive(p)]


def kill_all(pids: list[int]) -> None:
    """Cleanup only: SIGKILL (and SIGCONT, so a stopped process dies promptly) whatever
    is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)


def deploy(
    tmp_path: Path, executor: str, extension: str | None, **server: object
) -> Path:
    lines = [
        "dtype: float32",
        "enforce_eager: true",
        f"distributed_executor_backend: {executor}",
        "warmup:",
        "  enabled: false",
    ]
    if extension:
        lines.append(f"worker_extension_cls: faults_ext.{extension}")
    if server:
        lines.append("server:")
        lines += [f"  {key}: {value}" for key, value in server.items()]
    path = tmp_path / f"deploy-{executor}-{extension}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path
