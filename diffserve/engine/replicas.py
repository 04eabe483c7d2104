"""Data-parallel replicas (``num_replicas``): independent copies of a stage's worker
group.

Each replica is one ``Executor`` from ``make_executor(config, stage_id, replica=i)``
with its own heartbeat and consecutive-failure streak; ``EngineCore`` runs one dispatch
thread per replica, which pulls the next batch from the shared scheduler only while its
replica is free, so a free replica takes the work (least loaded) and a batch runs on
exactly one replica.

A replica that cannot serve (its worker died, a batch ran past its deadline, too many
failures in a row) is taken out and its workers are stopped; the others keep serving.
Only the last one going out kills the engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from diffserve.engine.admission import fill_defaults
from diffserve.engine.step_watch import StepPace
from diffserve.engine.watchdog import FailureStreak, Heartbeat
from diffserve.errors import EngineDeadError
from diffserve.executor.factory import make_executor
from diffserve.logging import get_logger
from diffserve.types.request import Carried, GenerationRequest

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import ResolvedConfig
    from diffserve.config.schema import StageConfig
    from diffserve.executor.base import Executor
    from diffserve.types.capabilities import PipelineCapabilities

logger = get_logger(__name__)

# How long a stopper waits for the dispatch thread to leave a batch (it fails at once
# when its replica is taken out; this only bounds a bug).
_STOP_WAIT_S = 10.0


class Replica:
    """One copy of the stage's worker group: its executor, heartbeat and failure
    streak."""

    def __init__(
        self, index: int, executor: Executor, max_consecutive_failures: int
    ) -> None:
        self.index = index
        self.executor = executor
        self.heartbeat = Heartbeat()
        # How long its phases take per unit of work (the step heartbeat's measure)
        self.pace = StepPace()
        self.failures = FailureStreak(max_consecutive_failures)
        # Why it was taken out (None while it serves).
        self.out: EngineDeadError | None = None
        self.thread: threading.Thread | None = None
        self.stopper: threading.Thread | None = None

    @property
    def live(self) -> bool:
        # The executor can be dead a moment before ``out`` is set (its monitor fails the
        # calls first).
        return self.out is None and not self.executor.is_dead


def warm_up(executor: Executor, stage: StageConfig) -> None:
    """Run the warmup request once on ``executor`` (every replica compiles and allocates
    its own)."""
    warm = stage.warmup
    capabilities = executor.capabilities
    request = (
        GenerationRequest(
            prompt="warmup",
            height=warm.height,
            width=warm.width,
            num_inference_steps=warm.steps,
            seed=0,
            max_sequence_length=64,
            request_id=f"warmup-{executor.replica}",
            carried=Carried(is_warmup=True),
        )
        if capabilities is None
        else capabilities.modality.warmup(
            capabilities,
            warm.height,
            warm.width,
            warm.steps,
            f"warmup-{executor.replica}",
        )
    )
    request = fill_defaults(request, stage.request_defaults, executor.capabilities)
    request = request.with_defaults(cache_threshold=stage.cache.request_threshold)
    start = time.monotonic()
    # Checked against the model (not the request limits: the operator chose it), then
    # straight to the executor: warmup never enters the queue, the counters or the stats
    # (the worker pauses the kernel counters for an all-warmup batch).
    if executor.capabilities is not None:
        executor.capabilities.check(request)
    executor.execute([request])
    logger.info(
        "replica %d: warmup %dx%d, %d step(s) took %.0f ms",
        executor.replica,
        warm.width,
        warm.height,
        warm.steps,
        (time.monotonic() - start) * 1000.0,
    )


class ReplicaSet:
    """The replicas of one engine, in index order, and what the engine reports across
    them."""

    def __init__(self, config: ResolvedConfig, stage: StageConfig) -> None:
        self.config = config
        self.stage = stage
        self.count = stage.num_replicas
        self.replicas: list[Replica] = []
        self._lock = threading.Lock()

    def start(self, on_dead: Callable[[Replica, EngineDeadError], None]) -> None:
        """Build every replica, then warm each up once. Replica 0 is built alone first:
        it imports the model code, and concurrent first imports in one process (``uni``)
        race in lazy modules. The others are then built, and all are warmed,
        concurrently: each loads the model, and N loads one after the other would
        multiply the startup time. If any fails, every replica that started is shut down
        and the lowest replica's error is raised."""
        built: list[Replica | None] = [None] * self.count

        def build(index: int) -> None:
            executor = make_executor(self.config, self.stage.stage_id, replica=index)
            replica = Replica(
                index, executor, self.config.server.max_consecutive_failures
            )
            # Before warmup: a death from here on must take the replica out.
            executor.on_dead = lambda error: on_dead(replica, error)
            built[index] = replica

        def warm(index: int) -> None:
            replica = built[index]
            if replica is not None and self.stage.warmup.enabled and self.config.model:
                warm_up(replica.executor, self.stage)

        failed = _each(build, [0])
        if failed is None:
            failed = _each(build, list(range(1, self.count)))
        if failed is None:
            failed = _each(warm, list(range(self.count)))
        self.replicas = [r for r in built if r is not None]
        if failed is not None:
            self.shutdown()
            raise failed

    # -- what the engine reports across replicas
    # -----------------------------------------------------

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.live]

    def take_out(self, replica: Replica, error: EngineDeadError) -> int | None:
        """Mark ``replica`` out of service and stop its workers in the background (a
        monitor thread may be the caller, and it cannot join itself). Returns how many
        replicas still serve, or None if it was already out."""
        with self._lock:
            if replica.out is not None:
                return None
            replica.out = error
            remaining = len(self.live())
            replica.stopper = threading.Thread(
                target=_stop,
                args=(replica,),
                daemon=True,
                name=f"diffserve-replica-stop-{replica.index}",
            )
            # Started under the lock: shutdown() joins every stopper it can see, so none
            # may be unstarted.
            replica.stopper.start()
        return remaining

    def executor(self) -> Executor:
        """A live replica's executor (replica 0's once none is live: for names and
        capabilities)."""
        live = self.live()
        return (live or self.replicas)[0].executor

    @property
    def capabilities(self) -> PipelineCapabilities | None:
        return self.executor().capabilities

    @property
    def worker_pids(self) -> list[int]:
        """Every replica's worker pids, replica-major (replicas taken out included)."""
        return [pid for r in self.replicas for pid in r.executor.worker_pids]

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """One result per rank of every live replica, replica-major (replica 0's ranks
        first). ``timeout`` bounds the whole call, not each replica."""
        deadline = None if timeout is None else time.monotonic() + timeout
        results: list[Any] = []
        for replica in self.live():
            remaining = (
                None if deadline is None else max(0.0, deadline - time.monotonic())
            )
            results.extend(
                replica.executor.collective_rpc(method, args, kwargs, remaining)
            )
        return results

    @property
    def heartbeat_age_s(self) -> float:
        """The stalest live replica loop (a stuck replica must show), else the freshest
        loop: the threads of replicas taken out keep beating while the engine lives."""
        live = self.live()
        if live:
            return max(r.heartbeat.age_s for r in live)
        return min((r.heartbeat.age_s for r in self.replicas), default=0.0)

    @property
    def loop_state(self) -> str:
        """``running`` while any live replica runs a batch, ``dead`` when no dispatch
        thread is left."""
        threads = [r.thread for r in self.replicas if r.thread is not None]
        if threads and not any(t.is_alive() for t in threads):
            return "dead"
        return (
            "running"
            if any(r.heartbeat.state == "running" for r in self.live())
            else "idle"
        )

    def shutdown(self) -> None:
        """Stop every replica's workers (idempotent), and wait for the take-out
        stoppers, so that no worker process outlives the engine's ``shutdown()``."""
        for replica in self.replicas:
            replica.executor.shutdown()
        for replica in self.replicas:
            stopper = replica.stopper
            if (
                stopper is not None
                and stopper.is_alive()
                and stopper is not threading.current_thread()
            ):
                stopper.join(timeout=20.0)


def _each(fn: Callable[[int], None], indexes: list[int]) -> BaseException | None:
    """Run ``fn(i)`` for every index, on threads when there are several; the lowest
    index's error."""
    errors: dict[int, BaseException] = {}

    def run(index: int) -> None:
        try:
            fn(index)
        except BaseException as exc:  # noqa: BLE001 - returned to the caller, which cleans up and raises
            errors[index] = exc

    if len(indexes) <= 1:
        for index in indexes:  # no thread: the plain case keeps plain tracebacks
            run(index)
    else:
        threads = [
            threading.Thread(
                target=run, args=(i,), name=f"diffserve-replica-start-{i}", daemon=True
            )
            for i in indexes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return errors[min(errors)] if errors else None


def _stop(replica: Replica) -> None:
    """Stop a replica that was taken out, once its dispatch thread is done with its
    batch: a hung batch is still being abandoned then, and the executor must know that
    before it decides how long to wait for its workers (uni: 0.5 s instead of 30 s for a
    thread that will never stop)."""
    deadline = time.monotonic() + _STOP_WAIT_S
    while replica.heartbeat.state == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    replica.executor.shutdown()
