"""worker_extension_cls: only an extension class is ever called; anything else is a
ConfigError first.

The side effects below write a marker file named by an environment variable, so the
proof also holds inside an mp worker process (which inherits the environment, not this
process's memory).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError
from diffserve.executor.factory import make_executor
from diffserve.worker.extension import WorkerExtension, load_extension

MARKER_ENV = "EXTENSION_TRUST_MARKER"


def _touch(what: str) -> None:
    with open(os.environ[MARKER_ENV], "a", encoding="utf-8") as f:
        f.write(what + "\n")


def make_extension() -> WorkerExtension:
    """A factory function: callable with no arguments, but not a class, so it must never
    run."""
    _touch("function called")
    return WorkerExtension()


class _CallableObject:
    def __call__(self) -> WorkerExtension:
        _touch("callable object called")
        return WorkerExtension()


callable_object = _CallableObject()


class NoHooks:
    """A class without the hooks: refusing it must not instantiate it."""

    def __init__(self) -> None:
        _touch("NoHooks instantiated")


class DuckExtension:
    """Not a WorkerExtension subclass, but has both hooks: accepted (documented)."""

    def before_load(self, worker) -> None:
        pass

    def after_load(self, worker) -> None:
        pass


class RealExtension(WorkerExtension):
    pass


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "called.txt"
    monkeypatch.setenv(MARKER_ENV, str(path))
    return path


@pytest.mark.parametrize("name", ["make_extension", "callable_object"])
def test_a_non_class_is_refused_without_being_called(marker: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="worker_extension_cls") as info:
        load_extension(f"{__name__}.{name}")
    assert "not a class" in str(info.value) and "WorkerExtension" in str(info.value)
    assert not marker.exists(), marker.read_text()


def test_a_class_without_hooks_is_refused_without_being_instantiated(
    marker: Path,
) -> None:
    with pytest.raises(ConfigError, match="worker_extension_cls.*no before_load"):
        load_extension(f"{__name__}.NoHooks")
    assert not marker.exists(), marker.read_text()


def test_subclass_and_duck_typed_classes_load() -> None:
    assert isinstance(load_extension(f"{__name__}.RealExtension"), RealExtension)
    assert isinstance(load_extension(f"{__name__}.DuckExtension"), DuckExtension)


@pytest.mark.parametrize("kind", ["uni", "mp"])
def test_worker_startup_refuses_a_function_without_calling_it(
    marker: Path, kind: str
) -> None:
    config = resolve(
        model=None,
        deploy_config={
            "distributed_executor_backend": kind,
            "worker_extension_cls": f"{__name__}.make_extension",
        },
        env={},
    )
    with pytest.raises(ConfigError, match="worker_extension_cls"):
        make_executor(config, ready_timeout=120)
    assert not marker.exists(), marker.read_text()
