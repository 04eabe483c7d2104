"""The processes of the system under test, from /proc (psutil is not a dependency):
children, command lines, and the mp workers of an engine process (forked by its
multiprocessing fork server, or spawned)."""

from __future__ import annotations

import os
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may contain spaces: split after the last
    # ')'.
    return text[text.rindex(")") + 2 :].split()


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
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
        )
    except (FileNotFoundError, ProcessLookupError):
        return ""


def worker_children(pid: int) -> list[int]:
    """The mp worker processes of the engine process ``pid``: forked by its
    multiprocessing fork server (a child of ``pid`` itself), or spawned as its own
    children; never the fork server or resource tracker."""
    out = []
    for child in children(pid):
        line = cmdline(child)
        if "multiprocessing" not in line or "resource_tracker" in line:
            continue
        if "forkserver" in line:
            out += children(child)  # the workers it forked (they keep its command line)
        else:
            out.append(child)
    return out
