"""The Ray actor that hosts one rank: the same worker command loop as uni and mp, on a
thread.

The actor is a threaded actor: ``submit`` (parent -> worker inbox), ``poll`` (worker
outbox -> parent, blocking up to a timeout) and ``join`` run on Ray's thread pool next
to the worker thread, so a long-polling reader never blocks a command. Inside, the
worker speaks ``queue_channel_pair`` exactly as the uni executor's thread does; only the
hop between driver and actor is Ray's.

Ray is imported inside the methods (this module is only loaded inside an actor or by
``executor/ray.py``), so importing it never requires the optional ``ray`` package.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import TYPE_CHECKING

from diffserve.logging import get_logger
from diffserve.tracing.provider import flush_tracing, start_tracing
from diffserve.types.channel import ChannelClosed, queue_channel_pair
from diffserve.types.messages import Command, Reply
from diffserve.types.results import RequestResult
from diffserve.worker.loop import serve
from diffserve.worker.worker import Worker

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig

logger = get_logger(__name__)


class RankActor:
    """One rank of one replica of a stage, as a Ray actor (``ray.remote`` is applied by
    the executor)."""

    def __init__(
        self,
        config: ResolvedConfig,
        stage_id: int,
        rank: int,
        replica: int,
        log_level: int | None,
        torch_threads: int | None = None,
        init_method: str | None = None,
    ) -> None:
        import ray
        import torch

        # Ray sets OMP_NUM_THREADS to the actor's num_cpus (1 here: the bundle is for
        # placement), which would run the model on one core where uni and mp use the
        # process default. Follow the driver's OMP_NUM_THREADS when it set one, else
        # every core of this node, as a spawned mp worker does.
        torch.set_num_threads(torch_threads or os.cpu_count() or 1)

        # The driver logs (CLI/server): so does its worker, at the same level.
        if log_level is not None:
            from diffserve.logging import configure_logging

            configure_logging(log_level)
        # OTEL_* come with the actor's runtime env (executor/ray.py): it exports the
        # spans it makes.
        start_tracing("worker")
        self.rank = rank
        # Recorded once: it goes into every attestation of this rank (``node``).
        self.node_id = ray.get_runtime_context().get_node_id()
        if ray.get_gpu_ids():
            config = _only_visible_gpu(config, stage_id)
        self._channel, worker_end = queue_channel_pair()
        # Call ids of execute commands: their "result" replies carry RequestResults to
        # stamp with the node.
        self._executes: set[int] = set()
        self._lock = threading.Lock()

        def run() -> None:
            try:
                serve(
                    worker_end,
                    lambda: Worker(
                        config,
                        stage_id,
                        rank,
                        executor="ray",
                        replica=replica,
                        init_method=init_method,
                    ),
                )
            finally:
                worker_end.close()  # the parent's reader sees the loop is gone
                # before the executor's ray.kill, which follows the loop's end
                flush_tracing()

        self._thread = threading.Thread(
            target=run, name=f"diffserve-ray-worker-{rank}", daemon=True
        )
        self._thread.start()

    def wait_ready(self, timeout: float) -> tuple[Reply | None, str]:
        """The worker's first reply (``ready`` or ``init_failed``), or None after
        ``timeout`` seconds."""
        if not self._channel.poll(timeout):
            return None, self.node_id
        try:
            return self._channel.recv(), self.node_id
        except ChannelClosed:
            return None, self.node_id

    def submit(self, command: Command) -> None:
        """Put one command into the worker's inbox (the loop serves them in arrival
        order)."""
        if command.kind == "execute":
            with self._lock:
                self._executes.add(command.call_id)
        self._channel.send(command)

    def poll(self, timeout: float) -> tuple[list[Reply], bool]:
        """Every reply waiting in the outbox (blocking up to ``timeout`` for the first
        one), and whether the worker loop has ended. One caller at a time (the parent's
        reader for this rank)."""
        replies: list[Reply] = []
        closed = False
        if self._channel.poll(timeout):
            while self._channel.poll(0):
                try:
                    replies.append(self._stamp(self._channel.recv()))
                except ChannelClosed:
                    closed = True
                    break
        return replies, closed

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the worker loop to end (after a shutdown
        command)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _stamp(self, reply: Reply) -> Reply:
        if reply.kind not in ("result", "error", "cancelled"):
            return reply
        with self._lock:
            is_execute = reply.call_id in self._executes
            self._executes.discard(reply.call_id)
        if is_execute and reply.kind == "result" and isinstance(reply.value, list):
            for output in reply.value:
                if isinstance(output, RequestResult):
                    output.attestation["node"] = self.node_id
        return reply


def rendezvous_address() -> str:
    """Run as a Ray task on rank 0's bundle: this node's IP and a port free on it."""
    import ray

    from diffserve.worker.distributed import free_port

    host = ray.util.get_node_ip_address()
    return f"tcp://{host}:{free_port(host)}"


def _only_visible_gpu(config: ResolvedConfig, stage_id: int) -> ResolvedConfig:
    """Ray hides every GPU but the bundle's (``CUDA_VISIBLE_DEVICES``), so each rank's
    device is index 0.

    Only ``devices`` changes; the fingerprint field is kept, so attestations name the
    driver's config.
    """
    stages = tuple(
        dataclasses.replace(stage, devices=(0,))
        if stage.stage_id == stage_id
        else stage
        for stage in config.stages
    )
    logger.info(
        "ray worker pid %d: GPU(s) %s assigned by Ray, using cuda:0",
        os.getpid(),
        os.environ.get("CUDA_VISIBLE_DEVICES", "?"),
    )
    return dataclasses.replace(config, stages=stages)
