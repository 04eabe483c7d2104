"""Helpers shared by the end-to-end tests."""

from __future__ import annotations


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a reaped-or-not child that already exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
