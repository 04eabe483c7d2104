"""The mp executor: one worker process per rank, a duplex pipe each, a monitor per
worker.

* Workers are forked from a fork server (``multiprocessing``'s ``forkserver``) that
  preloads torch,
  diffusers, transformers and diffserve's worker once per engine process: a worker then
  starts without importing them again (about 6 s on two cores, per worker). The fork
  server holds no thread, CUDA context or model, so a fork from it is as clean as a
  spawn; where there is none (Windows), workers are spawned. Workers that will run on
  CUDA are spawned too: a preloaded library may touch CUDA at import (seen on an H200:
  every forked worker failed "Cannot re-initialize CUDA in forked subprocess"), and a
  model load dwarfs the imports there. A worker takes the engine's environment as it is
  when the executor starts.

* Ready handshake with a timeout; a worker that fails to load reports why (same
  exception type).
* The monitor thread waits on the pipe *and* the process sentinel: replies are
  dispatched, and a
  worker that exits unasked fails every in-flight and later call with
  ``EngineDeadError``.
* Any other exception in a monitor (an undecodable reply, a truncated frame) marks the
  executor dead:
  the pipe is out of step from then on, and a silently dead reader would leave every
  later call hanging.
* A hung worker (``abandon``: a batch past its deadline) is SIGKILLed, so it cannot
  outlive its batch.
* Shutdown: a ``shutdown`` command, then SIGTERM, then SIGKILL, each wait bounded; a
  ``weakref.finalize``
  does the same at interpreter exit or garbage collection, and workers exit on their own
  when the parent is gone (a watchdog thread in the worker, running from before the
  model loads).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import time
import weakref
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from diffserve.errors import EngineDeadError
from diffserve.executor.base import DEFAULT_READY_TIMEOUT_S, Executor
from diffserve.executor.calls import remote_exception
from diffserve.logging import get_logger
from diffserve.registry.preload import worker_preload_modules
from diffserve.types.channel import ChannelClosed, PipeChannel
from diffserve.types.messages import Command
from diffserve.worker.device import device_for
from diffserve.worker.distributed import free_port
from diffserve.worker.process import process_main

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import ResolvedConfig

logger = get_logger(__name__)

_GRACE_S = 5.0  # after the shutdown command, before SIGTERM
_TERM_S = 3.0  # after SIGTERM, before SIGKILL
# after SIGKILL: the kernel reaps within milliseconds; past this, log and move on
_KILL_S = 5.0


class MultiprocExecutor(Executor):
    """``world_size`` spawned worker processes of one stage."""

    name = "mp"

    def __init__(
        self,
        config: ResolvedConfig,
        stage_id: int,
        replica: int = 0,
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        super().__init__(config, stage_id, replica, ready_timeout)
        self._processes: list[Any] = []
        self._channels: list[PipeChannel] = []
        # Registered before anything can fail, so a half-started executor is cleaned up
        # too.
        self._finalizer = weakref.finalize(
            self, _stop_processes, self._processes, self._channels
        )
        self._launch()

    def _start_workers(self) -> None:
        stage = self.config.stage(self.stage_id)
        ctx = worker_context(
            on_cuda=device_for(stage, 0, self.replica).startswith("cuda")
        )
        root_logger = logging.getLogger("diffserve")
        log_level = root_logger.level if root_logger.handlers else None
        # One rendezvous per replica for its process group (worker/distributed.py); a
        # single rank needs none.
        init_method = f"tcp://127.0.0.1:{free_port()}" if self.world_size > 1 else None
        for rank in range(self.world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            process = ctx.Process(
                target=process_main,
                name=f"diffserve-worker-{self.replica}-{rank}",
                daemon=True,
                args=(
                    child_conn,
                    self.config,
                    self.stage_id,
                    rank,
                    os.getpid(),
                    log_level,
                    self.replica,
                    init_method,
                    dict(os.environ),
                ),
            )
            process.start()
            child_conn.close()  # only the child holds its end: its exit closes the pipe
            self._processes.append(process)
            self._channels.append(PipeChannel(parent_conn))
        for rank in range(self.world_size):
            self._handshake(rank)

    def _handshake(self, rank: int) -> None:
        process, channel = self._processes[rank], self._channels[rank]
        # A peer that dies while loading would leave this rank waiting in the group
        # rendezvous.
        peers = {p.sentinel: r for r, p in enumerate(self._processes) if r != rank}
        ready = wait(
            [channel.connection, process.sentinel, *peers], timeout=self.ready_timeout
        )
        if not ready:
            raise EngineDeadError(
                f"mp worker {rank} not ready within {self.ready_timeout:.0f}s"
            )
        dead_peer = next((peers[s] for s in ready if s in peers), None)
        if dead_peer is not None and not (
            channel.connection in ready or channel.poll(0)
        ):
            # The peer's own report says why, when it sent one before exiting (a load
            # error on every rank).
            failed = self._startup_report(dead_peer)
            if failed is not None:
                raise remote_exception(failed)
            raise EngineDeadError(
                f"mp worker {dead_peer} exited during startup "
                f"(exit code {self._processes[dead_peer].exitcode}); see its stderr"
            )
        try:
            reply = (
                channel.recv()
                if channel.connection in ready or channel.poll(0)
                else None
            )
        except ChannelClosed:
            reply = None
        if reply is None:
            process.join(1.0)
            raise EngineDeadError(
                f"mp worker {rank} exited during startup (exit code "
                f"{process.exitcode}); see its stderr. "
                "Scripts that start an mp engine need an `if __name__ "
                "== '__main__':` guard (spawn)."
            )
        if reply.kind != "ready":
            raise remote_exception(reply)
        self.workers.append(reply.value)

    def _startup_report(self, rank: int) -> Any:
        """The failure reply a worker that exited during startup left in its pipe, if
        any."""
        channel = self._channels[rank]
        try:
            reply = channel.recv() if channel.poll(0) else None
        except ChannelClosed:
            return None
        return reply if reply is not None and reply.kind != "ready" else None

    def _read_replies(self, rank: int) -> None:
        try:
            self._watch(rank)
        except Exception as exc:  # noqa: BLE001 - any reader failure must be a death, never a silent hang
            process = self._processes[rank]
            self._mark_dead(
                f"mp worker {rank} (pid {process.pid}): reading its reply failed: "
                f"{type(exc).__name__}: {exc}"
            )

    def _watch(self, rank: int) -> None:
        process, channel = self._processes[rank], self._channels[rank]
        while True:
            try:
                ready = wait([channel.connection, process.sentinel])
            except (OSError, ValueError):  # the channel was closed by shutdown
                ready = [process.sentinel]
            if channel.connection in ready:
                try:
                    self._deliver(channel.recv())
                    continue
                except ChannelClosed:
                    pass
            elif channel.poll(0):
                continue  # drain replies sent just before the exit
            # Pipe closed or process gone: give the exit code a moment to appear for the
            # message.
            process.join(0.5)
            self._mark_dead(
                f"mp worker {rank} (pid {process.pid}) died, exit code "
                f"{process.exitcode}"
            )
            if self.world_size > 1 and not self._is_shutdown:
                # The process group is broken: a surviving rank would wait in its next
                # collective until the group timeout. Nothing can use it any more, so
                # stop it now.
                self._kill_hung()
            return

    def _send(self, rank: int, command: Command) -> None:
        try:
            self._channels[rank].send(command)
        except ChannelClosed as exc:
            raise EngineDeadError(f"mp worker {rank} is unreachable: {exc}") from exc

    def _kill_hung(self) -> None:
        for process in self._processes:
            if process.is_alive():
                logger.error("mp worker pid %s is hung, sending SIGKILL", process.pid)
                process.kill()
        _join_all(self._processes, _KILL_S)
        _warn_survivors(self._processes)

    def _stop_workers(self) -> None:
        self._finalizer()
        self._join_readers(2.0)


# What every worker imports before its model loads (the heavy part of a worker's start).
# diffusers and transformers import their models lazily, on first attribute access:
# their model code (transformers' modeling_utils with its quantizers, and each family's
# pipeline with the library modules it loads: the registry's ``worker_preload_modules``)
# is named here, or each worker would import it again after the fork (~1 CPU-s of a tiny
# image model worker's 1.6 s start on 2 cores).
FORKSERVER_PRELOAD = [
    "torch",
    "diffusers",
    "transformers",
    "transformers.modeling_utils",
    "diffserve.worker.process",
    *worker_preload_modules(),
]


def worker_context(on_cuda: bool = False) -> Any:
    """The multiprocessing context workers start from: the preloaded fork server, else
    (CUDA workers, or no fork server on this OS) spawn."""
    if on_cuda or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # Read when the server starts (the first worker)
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


def _stop_processes(processes: list[Any], channels: list[PipeChannel]) -> None:
    """Shutdown command, then SIGTERM, then SIGKILL. Never raises; references no
    executor."""
    for channel, process in zip(channels, processes, strict=False):
        if process.is_alive():
            with contextlib.suppress(ChannelClosed):
                channel.send(Command("shutdown"))
    _join_all(processes, _GRACE_S)
    for process in processes:
        if process.is_alive():
            logger.warning(
                "mp worker pid %s ignored shutdown, sending SIGTERM", process.pid
            )
            process.terminate()
    _join_all(processes, _TERM_S)
    for process in processes:
        if process.is_alive():
            logger.warning(
                "mp worker pid %s ignored SIGTERM, sending SIGKILL", process.pid
            )
            process.kill()
    _join_all(processes, _KILL_S)
    _warn_survivors(processes)
    for channel in channels:
        channel.close()


def _join_all(processes: list[Any], budget: float) -> None:
    """Join every process within ``budget`` seconds in total (never unbounded)."""
    deadline = time.monotonic() + budget
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))


def _warn_survivors(processes: list[Any]) -> None:
    # SIGKILL cannot be ignored; a process still here is in uninterruptible sleep (a
    # stuck driver call).
    for process in processes:
        if process.is_alive():
            logger.error(
                "mp worker pid %s is still alive after SIGKILL; giving up waiting",
                process.pid,
            )
