"""Process helpers for the adversarial tests: children from /proc (psutil is not a dependency)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    return text[text.rindex(")") + 2:].split()


def pid_alive(pid: int) -> bool:
    """Running or stopped; a zombie (exited, not reaped) counts as gone."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def children(pid: int) -> list[int]:
    """Live direct children of ``pid`` (every /proc entry whose ppid is ``pid``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[1] == str(pid) and fields[0] != "Z":
                found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def worker_children(pid: int) -> list[int]:
    """Spawned multiprocessing children of ``pid`` that are workers (not the resource tracker)."""
    return [c for c in children(pid) if "multiprocessing" in cmdline(c) and "resource_tracker" not in cmdline(c)]


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive; returns the survivors."""
    wait_until(lambda: not any(pid_alive(p) for p in pids), timeout)
    return [p for p in pids if pid_alive(p)]


def kill_all(pids: list[int]) -> None:
    """Cleanup only: SIGKILL (and SIGCONT, so a stopped process dies promptly) whatever is left."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)


def deploy(tmp_path: Path, executor: str, extension: str | None, **server: object) -> Path:
    lines = ["dtype: float32", "enforce_eager: true", f"distributed_executor_backend: {executor}",
             "warmup:", "  enabled: false"]
    if extension:
        lines.append(f"worker_extension_cls: faults_ext.{extension}")
    if server:
        lines.append("server:")
        lines += [f"  {key}: {value}" for key, value in server.items()]
    path = tmp_path / f"deploy-{executor}-{extension}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path
