"""An engine's health: a replica that cannot serve taken out, the engine dead with its
last one (waiting requests failed), and what it says about itself (``check_health``:
``EngineDeadError`` once no replica serves; ready; replicas live; its loops' heartbeat),
read by ``/health``, ``/ready`` and the metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffserve.errors import EngineDeadError
from diffserve.logging import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.engine.ar_stage import ArStage
    from diffserve.engine.replicas import Replica, ReplicaSet
    from diffserve.engine.scheduler import Scheduler
    from diffserve.engine.stage_loop import StageLoop

logger = get_logger(__name__)


class EngineHealth:
    """Mixed into ``EngineCore``, whose state it reads."""

    _dead: EngineDeadError | None
    _ready: bool
    _is_shutdown: bool
    replicas: ReplicaSet
    scheduler: Scheduler

    @property
    def side_stages(self) -> list[StageLoop | ArStage]:
        raise NotImplementedError

    def _take_out(self, replica: Replica, error: EngineDeadError) -> None:
        """Take a replica that cannot serve out of service (its executor's ``on_dead``,
        a hung batch, a failure streak); idempotent. The engine dies only with its last
        replica."""
        if self._is_shutdown:
            return  # the executors report their own shutdown as a death: not a failure
        remaining = self.replicas.take_out(replica, error)
        if remaining is None:
            return
        if remaining == 0:
            self._die(error)
        else:
            logger.error(
                "replica %d of %d taken out (%s); %d replica(s) still serve",
                replica.index,
                self.replicas.count,
                error,
                remaining,
            )

    def _die(self, error: EngineDeadError) -> None:
        if self._dead is None:
            self._dead = error
            logger.error("engine is dead: %s", error)
        for state in self.scheduler.drain():
            state.finish(EngineDeadError(str(error)))
        for extra in self.side_stages:  # their workers stop with the engine's shutdown
            extra.fail_waiting(str(error))

    def check_health(self) -> None:
        """Raise ``EngineDeadError`` when no replica serves; a degraded engine (some
        out) is healthy."""
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        if self._is_shutdown:
            raise EngineDeadError("the engine was shut down")
        if self._ready and not self.replicas.live():
            # The last replica is out but _die() may not have run yet (it follows
            # take_out): say why.
            reasons = [
                str(r.out or r.executor.calls.dead)
                for r in self.replicas.replicas
                if r.out is not None or r.executor.calls.dead is not None
            ]
            raise EngineDeadError(
                f"no replica is live: {reasons[-1]}"
                if reasons
                else "no replica is live"
            )

    @property
    def is_ready(self) -> bool:
        return self._ready and not self.is_dead and not self._is_shutdown

    @property
    def is_dead(self) -> bool:
        # No live replica counts at once: the monitor that takes the last one out marks
        # ``_dead`` a moment later.
        return self._dead is not None or (
            self._ready and not self._is_shutdown and not self.replicas.live()
        )

    @property
    def replicas_live(self) -> int:
        return (
            0
            if self._dead is not None or self._is_shutdown
            else len(self.replicas.live())
        )

    @property
    def heartbeat_age_s(self) -> float:
        """Seconds since the stalest live replica loop last beat (each beats every ~0.5
        s while idle)."""
        return self.replicas.heartbeat_age_s

    @property
    def loop_state(self) -> str:
        """``idle``, ``running`` (a batch is on an executor) or ``dead`` (engine dead or
        shut down)."""
        if self._dead is not None or self._is_shutdown:
            return "dead"
        return self.replicas.loop_state
