"""Worker extensions that inject faults (importable in worker processes: the tests put
this folder on PYTHONPATH for ``diffserve serve``, and spawned workers inherit the test
process's ``sys.path``)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from diffserve.worker.extension import WorkerExtension

# Set by a test at teardown to release a uni worker thread hung in a step (a thread
# cannot be killed).
RELEASE = threading.Event()


class HangExtension(WorkerExtension):
    """Every transformer forward blocks until RELEASE is set (never, in a worker
    process)."""

    def after_load(self, worker: Any) -> None:
        transformer = worker.pipeline.transformer

        def forward(*args: Any, **kwargs: Any) -> Any:
            RELEASE.wait()
            raise RuntimeError("released from the injected hang")

        transformer.forward = forward


class FailExtension(WorkerExtension):
    """Every batch raises inside the worker."""

    def after_load(self, worker: Any) -> None:
        def run(batch: list[Any], joins: Any = None) -> Any:
            raise RuntimeError(f"injected failure for a batch of {len(batch)}")

        worker.pipeline.run = run


class SlowStepExtension(WorkerExtension):
    """Every transformer forward sleeps FAULTS_STEP_S seconds first (a long, honest
    batch)."""

    def after_load(self, worker: Any) -> None:
        transformer = worker.pipeline.transformer
        original = transformer.forward
        delay = float(os.environ.get("FAULTS_STEP_S", "0.2"))

        def forward(*args: Any, **kwargs: Any) -> Any:
            time.sleep(delay)
            return original(*args, **kwargs)

        transformer.forward = forward


class SlowLoadExtension(WorkerExtension):
    """The model load takes FAULTS_LOAD_S seconds (default 60): a parent dies
    meanwhile."""

    def before_load(self, worker: Any) -> None:
        time.sleep(float(os.environ.get("FAULTS_LOAD_S", "60")))


def _undecodable() -> None:
    raise RuntimeError("this reply cannot be decoded")


class Garbage:
    """Pickles fine in the worker; unpickling it (in the parent) raises."""

    def __reduce__(self) -> tuple[Any, tuple]:
        return _undecodable, ()


class GarbageExtension(WorkerExtension):
    """An RPC whose reply the parent cannot decode."""

    def garbage(self) -> Garbage:
        return Garbage()

    def ping_ext(self) -> str:
        return "pong"
