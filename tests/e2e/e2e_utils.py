"""Helpers shared by the end-to-end tests."""

from __future__ import annotations

from background import pid_alive, wait_gone

__all__ = ["pid_alive", "wait_gone"]
