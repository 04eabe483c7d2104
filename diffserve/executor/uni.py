"""The uni executor: the worker runs inside the calling process (same PID), on its own
thread.

The worker thread serves the same command loop as an mp worker process, so an RPC waits
for the running batch, a cancel lands between steps and a timeout means the same thing
as on mp. Only the channel differs: in-process queues, objects passed by reference (no
copies of images).

A thread cannot be killed: a hung worker thread (``abandon``) is left behind as a
daemon, the executor is dead, and shutdown no longer waits for it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from diffserve.errors import EngineDeadError
from diffserve.executor.base import DEFAULT_READY_TIMEOUT_S, Executor
from diffserve.executor.calls import remote_exception
from diffserve.logging import get_logger
from diffserve.types.channel import ChannelClosed, QueueChannel, queue_channel_pair
from diffserve.types.messages import Command
from diffserve.worker.loop import serve
from diffserve.worker.worker import Worker

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import ResolvedConfig

logger = get_logger(__name__)

_JOIN_S = 30.0  # a batch notices shutdown at its next step; a long step gets this long


class UniExecutor(Executor):
    """The one rank of a stage as a thread of this process (the registry caps uni at one
    rank)."""

    name = "uni"

    def __init__(
        self,
        config: ResolvedConfig,
        stage_id: int,
        replica: int = 0,
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        super().__init__(config, stage_id, replica, ready_timeout)
        self._channels: list[QueueChannel] = []
        self._threads: list[threading.Thread] = []
        self._hung = False
        self._launch()

    def _start_workers(self) -> None:
        for rank in range(self.world_size):
            self._start_worker(rank)

    def _start_worker(self, rank: int) -> None:
        parent_end, worker_end = queue_channel_pair()
        config, stage_id, replica = self.config, self.stage_id, self.replica

        def run() -> None:
            try:
                serve(
                    worker_end,
                    lambda: Worker(
                        config, stage_id, rank, executor="uni", replica=replica
                    ),
                )
            finally:
                worker_end.close()  # tells the reader the worker is gone

        thread = threading.Thread(
            target=run, name=f"diffserve-uni-worker-{rank}", daemon=True
        )
        thread.start()
        self._channels.append(parent_end)
        self._threads.append(thread)
        if not parent_end.poll(self.ready_timeout):
            raise EngineDeadError(
                f"uni worker {rank} not ready within {self.ready_timeout:.0f}s"
            )
        reply = parent_end.recv()
        if reply.kind != "ready":
            raise remote_exception(reply)
        self.workers.append(reply.value)

    def _read_replies(self, rank: int) -> None:
        channel = self._channels[rank]
        try:
            while True:
                try:
                    reply = channel.recv()
                except ChannelClosed:
                    self._mark_dead(f"uni worker {rank} stopped")
                    return
                self._deliver(reply)
        except Exception as exc:  # noqa: BLE001 - a dead reader must be a death, never a silent hang
            self._mark_dead(
                f"uni worker {rank}: reading its reply failed: {type(exc).__name__}: "
                f"{exc}"
            )

    def _kill_hung(self) -> None:
        # Nothing can stop a thread stuck in a step; remember it so shutdown does not
        # wait on it.
        self._hung = True

    def _send(self, rank: int, command: Command) -> None:
        if not self._threads[rank].is_alive():
            raise EngineDeadError(f"uni worker {rank} is not running")
        self._channels[rank].send(command)

    def _stop_workers(self) -> None:
        for channel in self._channels:
            channel.send(Command("shutdown"))
        budget = 0.5 if self._hung else _JOIN_S
        for thread in self._threads:
            # A batch notices shutdown at its next step; a thread stuck in a long step
            # stays a daemon.
            thread.join(timeout=budget)
            if thread.is_alive():
                logger.warning(
                    "uni worker thread %s did not stop within %.1fs; left "
                    "behind as a daemon",
                    thread.name,
                    budget,
                )
        # The readers end once their worker's channel closes. Joined, so none is still
        # freeing a reply's tensors when the interpreter finalizes: a daemon thread
        # woken then exits through torch's C++ frames and aborts the process ("terminate
        # called without an active exception").
        self._join_readers(budget)
