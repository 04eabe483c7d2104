"""One persistent thread for all of a generic pipeline's torch work: its load and every
batch.

diffusers' ``__call__`` runs a whole request, so ``GenericPipeline.run`` drives it from
another thread and turns its step callbacks into ``StepEvent``s. That thread must be the
same one for the pipeline's lifetime, and the only one that runs torch's parallel
regions in the worker process: with GNU OpenMP (torch's CPU threads), as soon as a
second thread of a process has run a parallel region, the process has more OpenMP
threads than cores and libgomp stops spinning between regions, so every op of the
compute thread pays a wake-up of its team (measured on 2 cores: SD3 256x256/4 steps 0.80
s on a new thread per batch after the load on the worker's thread, against 0.53 s for
diffusers on one thread). So the weights are loaded here too, and every batch runs here.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class ComputeThread:
    """A daemon thread that runs submitted callables one at a time, in order (a hung
    diffusers call must not block interpreter exit: the engine abandons a hung worker,
    it cannot stop a thread)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn``; its result (or exception) arrives in the returned future."""
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        return future

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the thread and wait for its result (re-raising what it
        raised)."""
        return self.submit(fn).result()

    def stop(self, timeout: float = 10.0) -> None:
        """Let the thread end after the queued jobs and wait up to ``timeout`` seconds
        for it (not from the thread itself). A thread still ending while the interpreter
        tears down can abort the process ("terminate called without an active
        exception": torch's and libgomp's static destructors run under it; seen once in
        a loaded test run); a hung job is abandoned after the timeout."""
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._run(*job)
            # Nothing of a finished job stays referenced while the thread waits (its
            # result may be the pipeline that owns this thread: holding it would keep
            # both alive).
            del job

    @staticmethod
    def _run(fn: Callable[[], Any], future: Future[Any]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            future.set_exception(exc)
