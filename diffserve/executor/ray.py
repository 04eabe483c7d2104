"""The ray executor: one Ray actor per rank, placed in one placement group per replica.

* Where: ``ray_address`` (pipeline-wide). ``""`` starts a local Ray sized to this
  machine on loopback only
  (``start_local_ray``), unless this process already initialized Ray (then that one is
  reused, e.g. a test-session fixture); ``auto`` joins the running cluster;
  ``host:6379`` / ``ray://host:10001`` join that one (with Ray's own choice of
  addresses, except that a cluster on loopback is joined as ``127.0.0.1``:
  ``join_cluster``).
* Placement (``ray_placement.py``): a placement group per replica with one bundle per
  rank (``{"CPU": 1}``,
  or ``{"GPU": 1}`` on a CUDA or ROCm platform), ``STRICT_PACK``: a replica's ranks
  share one node; the replicas are spread, each group asked for on the alive node with
  room that holds the fewest diffserve groups. Rank r's actor is pinned to bundle r, so
  a replica's ranks are scheduled together or not at all.
* Each actor (``ray_actor.RankActor``) runs the same command loop as uni and mp on a
  thread; ``_send``
  waits for the actor to accept each command (a threaded actor does not keep submission
  order, a confirmed submit does), and one reader thread per rank long-polls the actor's
  outbox.
* Death: any exception while polling (``ActorDiedError`` when the actor process is
  killed or its node is
  lost) marks the executor dead; Ray reports a killed actor within about a second. An
  executor is one replica, so a lost node takes out the replicas on it and the engine
  serves on with the others.
* ``node``: the actor records its Ray node id and stamps it into the attestation of
  every result of an
  execute (``WorkerInfo`` and the worker are unchanged).
* Shutdown: a ``shutdown`` command, a bounded wait for the loops, then ``ray.kill``
  every actor and
  remove the placement group; on this node, a bounded wait until the actor processes are
  gone. Actors are owned by this process, so Ray also kills them when it exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from diffserve.errors import EngineDeadError
from diffserve.executor.base import DEFAULT_READY_TIMEOUT_S, Executor
from diffserve.executor.calls import remote_exception
from diffserve.executor.ray_actor import RankActor, rendezvous_address
from diffserve.executor.ray_connect import connect
from diffserve.executor.ray_env import worker_env
from diffserve.executor.ray_placement import GROUP_PREFIX, describe_free, place_replica
from diffserve.logging import get_logger
from diffserve.types.messages import Command, Reply

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig

logger = get_logger(__name__)

_POLL_S = 0.5  # how long one poll blocks inside the actor
_GET_SLICE_S = 1.0  # how often a waiting reader re-checks that the executor is stopping
# A live actor accepts a command in milliseconds; past this it is unreachable.
_SUBMIT_S = 30.0
_GRACE_S = 5.0  # after the shutdown command, before ray.kill
_EXIT_S = 5.0  # after ray.kill, for the actor processes on this node to be gone
# Poll + submit + join, and one spare so a slow call never starves the others.
_MAX_CONCURRENCY = 4


class RayExecutor(Executor):
    """``world_size`` Ray actors of one replica of a stage."""

    name = "ray"

    def __init__(
        self,
        config: ResolvedConfig,
        stage_id: int,
        replica: int = 0,
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        super().__init__(config, stage_id, replica, ready_timeout)
        self._actors: list[Any] = []
        self._placement: Any = None
        self._stopping = threading.Event()
        self._hung = False
        # Ray node id of each rank, in rank order (also stamped into every attestation
        # as ``node``).
        self.nodes: list[str] = []
        self._gpu = config.platform in ("cuda", "rocm")
        self._launch()

    def _start_workers(self) -> None:
        connect(self.config.ray_address)
        self._place()
        self._start_actors()
        self._handshake()

    def _ready_detail(self) -> str:
        return f", nodes={self.nodes}"

    def _place(self) -> None:
        bundle: dict[str, float] = {"GPU": 1} if self._gpu else {"CPU": 1}
        unique = uuid.uuid4().hex[:8]
        name = f"{GROUP_PREFIX}stage{self.stage_id}-replica{self.replica}-{unique}"
        self._placement, placed = place_replica(
            bundle, self.world_size, name, self.ready_timeout
        )
        if not placed:
            raise EngineDeadError(
                f"ray executor: {self.world_size} bundle(s) of {bundle} "
                "not placed on one node (a replica's ranks "
                f"share a node) within {self.ready_timeout:.0f}s; {describe_free()}"
            )

    def _start_actors(self) -> None:
        root_logger = logging.getLogger("diffserve")
        log_level = root_logger.level if root_logger.handlers else None
        actor_cls = ray.remote(RankActor)
        init_method = self._rendezvous() if self.world_size > 1 else None
        for rank in range(self.world_size):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self._placement, placement_group_bundle_index=rank
            )
            actor = actor_cls.options(
                num_cpus=0 if self._gpu else 1,
                num_gpus=1 if self._gpu else 0,
                max_concurrency=_MAX_CONCURRENCY,
                max_restarts=0,
                scheduling_strategy=strategy,
                # OTEL_*: an actor on another node traces (and exports its spans) as
                # this process does.
                runtime_env={"env_vars": worker_env()},
            ).remote(
                self.config,
                self.stage_id,
                rank,
                self.replica,
                log_level,
                _driver_threads(),
                init_method,
            )
            self._actors.append(actor)

    def _rendezvous(self) -> str:
        """``tcp://ip:port`` on the node of bundle 0 (where rank 0 will run): the
        process group's store."""
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self._placement, placement_group_bundle_index=0
        )
        ref = (
            ray.remote(rendezvous_address)
            .options(num_cpus=0, scheduling_strategy=strategy)
            .remote()
        )
        return str(ray.get(ref, timeout=self.ready_timeout))

    def _handshake(self) -> None:
        # Every rank loads at once; the deadline covers them all.
        deadline = time.monotonic() + self.ready_timeout
        pending = [
            actor.wait_ready.remote(self.ready_timeout) for actor in self._actors
        ]
        for rank, ref in enumerate(pending):
            try:
                reply, node = ray.get(
                    ref, timeout=max(1.0, deadline - time.monotonic() + 5.0)
                )
            except GetTimeoutError:
                reply, node = None, ""
            except Exception as exc:  # noqa: BLE001 - the actor could not be created or died loading
                raise EngineDeadError(
                    f"ray worker {rank} failed to start: {_short(exc)}"
                ) from exc
            if reply is None:
                raise EngineDeadError(
                    f"ray worker {rank} not ready within {self.ready_timeout:.0f}s"
                )
            if reply.kind != "ready":
                raise remote_exception(reply)
            self.workers.append(reply.value)
            self.nodes.append(node)

    def _who(self, rank: int) -> str:
        pid = self.workers[rank].pid if rank < len(self.workers) else "?"
        node = self.nodes[rank][:12] if rank < len(self.nodes) else "?"
        return f"pid {pid}, node {node}"

    def _read_replies(self, rank: int) -> None:
        actor = self._actors[rank]
        try:
            while True:
                answer = self._get(actor.poll.remote(_POLL_S))
                if answer is None:
                    return  # stopping
                replies, closed = answer
                for reply in replies:
                    self._deliver(reply)
                if closed:
                    self._mark_dead(
                        f"ray worker {rank} ({self._who(rank)}) died: its command "
                        "loop ended"
                    )
                    self._kill_group()
                    return
        except Exception as exc:  # noqa: BLE001 - a dead reader must be a death, never a silent hang
            if not self._stopping.is_set():
                self._mark_dead(
                    f"ray worker {rank} ({self._who(rank)}) died: {_short(exc)}"
                )
                self._kill_group()

    def _kill_group(self) -> None:
        # Several ranks share a process group that is now broken: a survivor would wait
        # in its next collective until the group timeout, so it goes at once (as on mp).
        if self.world_size > 1 and not self._stopping.is_set():
            self._kill_hung()

    def _get(self, ref: Any) -> tuple[list[Reply], bool] | None:
        """The poll's answer, or None once the executor is stopping (re-checked every
        second)."""
        while not self._stopping.is_set():
            try:
                return ray.get(ref, timeout=_GET_SLICE_S)
            except GetTimeoutError:
                # a step holding the GIL can delay a poll; death shows up as an error
                # instead
                continue
        return None

    def _send(self, rank: int, command: Command) -> None:
        if self._stopping.is_set() or rank >= len(self._actors):
            raise EngineDeadError(f"ray worker {rank} is not running")
        # An unpicklable command raises here, as on mp.
        ref = self._actors[rank].submit.remote(command)
        try:
            ray.get(ref, timeout=_SUBMIT_S)
        except Exception as exc:  # noqa: BLE001 - dead or wedged actor: the caller sees EngineDeadError
            raise EngineDeadError(
                f"ray worker {rank} is unreachable: {_short(exc)}"
            ) from exc

    def _kill_hung(self) -> None:
        self._hung = True
        if not ray.is_initialized():  # any other Ray call would start a new local Ray
            return
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)

    def _stop_workers(self) -> None:
        if not ray.is_initialized():
            # Ray was shut down first (its actors died with it); any Ray call would
            # start a new one.
            self._stopping.set()
            return
        if self._actors and not self._hung and self.calls.dead is None:
            with contextlib.suppress(Exception):
                for actor in self._actors:
                    actor.submit.remote(Command("shutdown"))
                # A batch notices shutdown at its next step; a loop stuck in a long call
                # is killed below.
                ray.wait(
                    [actor.join.remote(_GRACE_S) for actor in self._actors],
                    num_returns=len(self._actors),
                    timeout=_GRACE_S + 1.0,
                )
        self._stopping.set()
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        if self._placement is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self._placement)
        self._join_readers(_GET_SLICE_S + 1.0)
        self._reap_local()

    def _reap_local(self) -> None:
        """Wait (bounded) until the actor processes on this node are gone; SIGKILL a
        straggler."""
        try:
            here = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - not connected any more: nothing left to check from here
            return
        pids = [
            info.pid
            for info, node in zip(self.workers, self.nodes, strict=False)
            if node == here
        ]
        deadline = time.monotonic() + _EXIT_S
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in pids:
            if _alive(pid):
                logger.warning(
                    "ray worker pid %d outlived ray.kill by %.0fs, sending SIGKILL",
                    pid,
                    _EXIT_S,
                )
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (its parent, the raylet, reaps
    it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, OSError):
        return False


def _short(exc: BaseException) -> str:
    # Ray's actor-death messages run to many lines; the first names the cause.
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _driver_threads() -> int | None:
    """The driver's ``OMP_NUM_THREADS``, if it set a valid one (the actors follow
    it)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None
