"""Publish a built directory atomically: build in a staging directory beside the target,
then rename it into place, so a failed or interrupted build never leaves a half-written
model behind, and a ``force`` rebuild only ever replaces a directory of the same kind
(one holding its marker file)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from diffserve.errors import ConfigError
from diffserve.logging import get_logger

logger = get_logger(__name__)


def build_into(
    target: Path,
    write: Callable[[Path], None],
    *,
    force: bool,
    marker: str = "model_index.json",
) -> Path:
    """Run ``write(staging)`` in a fresh directory beside ``target``, then publish it
    atomically as ``target``; on any failure nothing is left behind (not even parents
    this call created). ``force`` replaces only a directory holding ``marker`` (what
    such a build writes)."""
    check_target(target, force=force, marker=marker)
    created_parents = _make_parents(target)
    try:
        staging = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent)
        )
    except OSError as exc:
        _remove_empty(created_parents)
        raise _unwritable(target, exc) from None
    try:
        write(staging)
        _normalize_permissions(staging)
        _move_into_place(staging, target, force=force, marker=marker)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created_parents)
        raise
    return target


def check_target(
    target: Path, *, force: bool, marker: str = "model_index.json"
) -> None:
    """Reject a target that a build could not (or must not) replace, before any heavy
    work."""
    if target.exists() and not target.is_dir():
        raise ConfigError(
            f"{target} exists and is not a directory",
            path="DIR",
            hint="choose a new directory",
        )
    if target.is_dir() and any(target.iterdir()):
        if not force:
            raise ConfigError(
                f"{target} is not empty",
                path="DIR",
                hint="choose an empty directory or pass --force to replace "
                "the model in it",
            )
        if not (target / marker).is_file():
            raise ConfigError(
                f"{target} is not empty and holds no {marker}; refusing to delete it",
                path="DIR",
                hint="remove it yourself or choose another directory",
            )
    # The deepest existing ancestor is where the staging directory's parents get
    # created.
    probe = target.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise _unwritable(target, NotADirectoryError(20, "Not a directory"))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise _unwritable(target, PermissionError(13, "Permission denied"))


def _normalize_permissions(root: Path) -> None:
    """mkdtemp makes 0700 and some savers write 0600; give the result ordinary umask
    permissions."""
    umask = _current_umask()
    root.chmod(0o777 & ~umask)
    for path in root.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _current_umask() -> int:
    # /proc avoids os.umask's set-and-restore, which would briefly change it for other
    # threads.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _move_into_place(staging: Path, target: Path, *, force: bool, marker: str) -> None:
    """Atomically publish ``staging`` as ``target``; a replaced model is moved aside,
    then deleted."""
    old: Path | None = None
    if target.is_dir():
        if any(target.iterdir()):
            # Re-checked: something may have appeared meanwhile.
            check_target(target, force=force, marker=marker)
            old = Path(
                tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent)
            )
            os.replace(target, old / "model")
        else:
            target.rmdir()
    try:
        os.rename(staging, target)
    except OSError as exc:
        # Another build published here meanwhile.
        if target.is_dir() and any(target.iterdir()):
            raise ConfigError(
                f"{target} is not empty", path="DIR", hint="another build wrote it"
            ) from exc
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _make_parents(target: Path) -> list[Path]:
    """Create missing parents of ``target``; returns those created (deepest first) for
    cleanup."""
    missing = []
    probe = target.parent
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_empty(missing)
        raise _unwritable(target, exc) from None
    return missing


def _remove_empty(dirs: list[Path]) -> None:
    for path in dirs:  # deepest first
        try:
            path.rmdir()
        except OSError:
            break


def _unwritable(target: Path, exc: OSError) -> ConfigError:
    reason = exc.strerror or str(exc)
    return ConfigError(
        f"cannot write {target}: {reason}",
        path="DIR",
        hint="choose a writable directory",
    )


def build_seeded(
    kind: str,
    out_dir: Path | str,
    seed: int,
    write: Callable[[Path, int], None],
    *,
    force: bool,
    marker: str = "model_index.json",
) -> Path:
    """A seeded builder's common part: check ``seed``, then ``write(staging, seed)``
    published atomically as ``out_dir`` (``build_into``, ``marker`` naming what such a
    build writes). Raises ConfigError for a bad seed or target."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(
            f"seed must be a non-negative integer, got {seed!r}", path="seed"
        )
    target = Path(out_dir).expanduser().absolute()
    logger.info("building %s (seed %d) in %s", kind, seed, target)
    return build_into(
        target, lambda staging: write(staging, seed), force=force, marker=marker
    )
