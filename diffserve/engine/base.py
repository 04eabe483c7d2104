"""What ``Engine`` and ``AsyncEngine`` share: construction from the same keywords as
``resolve()``, RPCs to the workers, health, stats and an idempotent shutdown (also as a
context manager)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from diffserve.engine.core import EngineCore
from diffserve.engine.load import ModelLoad, model_load
from diffserve.logging import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import ResolvedConfig
    from diffserve.engine.stats import BatchStats
    from diffserve.types.capabilities import PipelineCapabilities
    from diffserve.types.memory import ComponentWeights
    from diffserve.types.request import GenerationRequest

logger = get_logger(__name__)

E = TypeVar("E", bound="EngineBase")


class EngineBase:
    """Common front end over one ``EngineCore``."""

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        deploy_config: str | os.PathLike | Mapping[str, Any] | None = None,
        *,
        stage_overrides: Mapping[Any, Mapping[str, Any]] | None = None,
        platform: str | None = None,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> None:
        """``overrides`` are engine fields for every stage
        (``linear_backend="torch"``...), exactly the ``overrides`` of
        ``diffserve.config.resolve.resolve``; the other keywords are passed as is."""
        from diffserve.config.resolve import resolve

        config = resolve(
            model=model,
            deploy_config=deploy_config,
            overrides=overrides or None,
            stage_overrides=stage_overrides,
            platform=platform,
            env=env,
        )
        self._core = EngineCore(config)

    @classmethod
    def from_config(cls: type[E], config: ResolvedConfig) -> E:
        """Build from an already resolved config (what the CLI and the server do)."""
        engine = cls.__new__(cls)
        engine._core = EngineCore(config)
        return engine

    # -- introspection
    # ------------------------------------------------------------------------------

    @property
    def config(self) -> ResolvedConfig:
        return self._core.config

    @property
    def executor_name(self) -> str:
        return self._core.executor.name

    @property
    def capabilities(self) -> PipelineCapabilities | None:
        return self._core.replicas.capabilities

    def admit(self, request: GenerationRequest) -> GenerationRequest:
        """The request as admission makes it (defaults, limits, capabilities, seed),
        nothing queued."""
        return self._core.admit(request)

    @property
    def weights(self) -> dict[str, ComponentWeights]:
        """Each loaded component's weights on its device (``models/memory.py``), from a
        live replica's first worker (every replica and rank loads the same
        components)."""
        weights: dict[str, ComponentWeights] = {}
        stages = (
            [self._core.encode.replicas.executor()]
            if self._core.encode is not None
            else []
        ) + [self._core.executor]
        # A staged topology: the text encoders live in their own stage's workers.
        for executor in stages:
            if executor.workers:
                weights.update(executor.workers[0].weights)
        return weights

    @property
    def worker_pids(self) -> list[int]:
        """Every replica's worker pids, replica-major (``[replica 0 rank 0, rank 1...,
        replica 1 ...]``), replicas taken out included: the denoising stage's, then (a
        staged topology) each other stage's."""
        return [
            *self._core.replicas.worker_pids,
            *(
                pid
                for stage in self._core.extra_stages
                for pid in stage.replicas.worker_pids
            ),
        ]

    @property
    def num_replicas(self) -> int:
        """Replicas configured (``num_replicas``)."""
        return self._core.replicas.count

    @property
    def replicas_live(self) -> int:
        """Replicas still serving (0 once the engine is dead or shut down)."""
        return self._core.replicas_live

    @property
    def stage_health(self) -> list[dict[str, Any]]:
        """Per stage, in stage order: ``stage_id``, ``role``, ``replicas_live``,
        ``replicas`` and ``queue_depth`` (requests waiting for that stage) (one entry on
        the single topology; a staged one lists its text-encoder and decoder stages
        too)."""
        core = self._core
        dead = self.is_dead
        sets = sorted(
            [
                *((s.stage, s.replicas, s.scheduler) for s in core.extra_stages),
                (core.stage, core.replicas, core.scheduler),
            ],
            key=lambda entry: entry[0].stage_id,
        )
        ar = [
            {
                "stage_id": s.stage.stage_id,
                "role": s.stage.role,
                "kind": "ar",
                "replicas_live": 0 if dead else s.status()["replicas_live"],
                "replicas": s.stage.num_replicas,
                "queue_depth": s.scheduler.queue_depth,
            }
            for s in core.ar
        ]
        return [
            *ar,
            *(
                {
                    "stage_id": stage.stage_id,
                    "role": stage.role,
                    "replicas_live": 0 if dead else len(replicas.live()),
                    "replicas": replicas.count,
                    "queue_depth": scheduler.queue_depth,
                }
                for stage, replicas, scheduler in sets
            ),
        ]

    @property
    def load(self) -> ModelLoad:
        """The denoising stage's queue, running requests and outstanding work
        (``engine/load.py``), in total and per replica: what a router or an autoscaler
        weighs (the other stages' queues are in ``stage_health``)."""
        core = self._core
        waiting, running, schedule = core.scheduler.load_snapshot()
        dead = self.is_dead
        return model_load(
            waiting,
            running,
            {r.index: r.live and not dead for r in core.replicas.replicas},
            schedule,
        )

    @property
    def is_ready(self) -> bool:
        return self._core.is_ready

    @property
    def is_dead(self) -> bool:
        return self._core.is_dead

    @property
    def heartbeat_age_s(self) -> float:
        """Seconds since the stalest live replica loop last beat: at most ~0.5 s while
        idle; it grows while a batch runs (bounded by the batch deadline) and without
        bound once the loop is gone."""
        return self._core.heartbeat_age_s

    @property
    def loop_state(self) -> str:
        """``idle``, ``running`` or ``dead`` (the engine died or was shut down)."""
        return self._core.loop_state

    @property
    def queue_depth(self) -> int:
        return self._core.scheduler.queue_depth

    @property
    def num_running(self) -> int:
        return self._core.scheduler.num_running

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` if a worker died or the engine was shut down."""
        self._core.check_health()

    def stats(self) -> dict[str, Any]:
        """Cumulative counters since start (warmup excluded), including recent batch
        sizes."""
        return self._core.counters.as_dict()

    def add_stats_listener(self, listener: Callable[[BatchStats], None]) -> None:
        """``listener(BatchStats)`` after every executed batch (on the engine thread:
        keep it cheap)."""
        self._core.add_stats_listener(listener)

    # -- workers
    # ----------------------------------------------------------------------------------

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]:
        """Call ``method`` (a worker-extension method or built-in, or a picklable
        ``fn(worker, ...)``) on every worker of every live replica, between batches.
        Returns one result per rank, replica-major (replica 0's ranks in rank order,
        then replica 1's...); ``timeout`` bounds the whole call."""
        self._core.check_health()
        return self._core.replicas.collective_rpc(method, args, kwargs, timeout)

    # -- lifetime
    # ----------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the engine and its workers. Idempotent; waiting requests fail with
        EngineDeadError."""
        core = getattr(self, "_core", None)
        if core is not None:
            core.shutdown()

    def __enter__(self: E) -> E:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()
