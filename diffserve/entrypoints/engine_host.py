"""Owns the engine inside the server process: builds it in the background, answers
liveness and readiness, and hands it to handlers only when it can serve.

The engine is built *after* the server starts listening, so ``GET /health`` answers
while the model loads and ``GET /ready`` flips once it is loaded and warmed (load
balancers route on /ready). Used by the HTTP routes (``openai/``), the job runner
(``jobs/``) and the Ray Serve front, so it imports none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from diffserve.engine.client import AsyncEngineClient
from diffserve.engine.load import ModelLoad
from diffserve.errors import EngineDeadError, EngineNotReadyError
from diffserve.logging import get_logger

logger = get_logger(__name__)

# Builds the engine (blocking: loads weights); called on a worker thread after the
# server listens.
EngineFactory = Callable[[], AsyncEngineClient]


class EngineHost:
    def __init__(
        self,
        engine: AsyncEngineClient | None = None,
        factory: EngineFactory | None = None,
        on_loaded: Callable[[AsyncEngineClient], None] | None = None,
    ) -> None:
        if (engine is None) == (factory is None):
            raise ValueError("give exactly one of engine or factory")
        self.engine = engine
        self._on_loaded = on_loaded
        self._factory = factory
        self._load_task: asyncio.Task[None] | None = None
        self.load_error: BaseException | None = None

    async def start(self, after: EngineHost | None = None) -> None:
        """Begin loading (non-blocking). Called from the app's lifespan. ``after``: load
        once that host's load has ended, well or not (a server of several models loads
        them one at a time: peak memory is one load's, and the first model serves while
        the next loads)."""
        if self.engine is not None and self._on_loaded is not None:
            self._on_loaded(self.engine)
        if self._factory is not None and self._load_task is None:
            before = after._load_task if after is not None else None
            self._load_task = asyncio.create_task(
                self._load(before), name="diffserve-engine-load"
            )

    async def _load(self, before: asyncio.Task[None] | None = None) -> None:
        assert self._factory is not None
        if before is not None:
            await asyncio.gather(asyncio.shield(before), return_exceptions=True)
        try:
            # Loading weights and warming up is blocking CPU/GPU work: keep the event
            # loop free.
            engine = await asyncio.to_thread(self._factory)
            if self._on_loaded is not None:
                self._on_loaded(engine)
            self.engine = engine
            logger.info("engine loaded; ready=%s", self.is_ready)
        except BaseException as exc:  # noqa: BLE001 - recorded and reported through /health and 503s
            self.load_error = exc
            logger.error("engine failed to load: %s: %s", type(exc).__name__, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def wait_loaded(self) -> None:
        if self._load_task is not None:
            await asyncio.shield(self._load_task)

    @property
    def is_dead(self) -> bool:
        if self.load_error is not None:
            return True
        return self.engine is not None and self.engine.is_dead

    def death_reason(self) -> str:
        """Why the engine cannot serve: its load failed (a bad model file names itself
        here), or its last replica of a stage is gone (the engine's own error names the
        stage)."""
        if self.load_error is not None:
            return (
                f"it failed to load: {type(self.load_error).__name__}: "
                f"{self.load_error}"
            )
        if self.engine is not None and self.engine.is_dead:
            try:
                self.engine.check_health()
            except EngineDeadError as exc:
                return str(exc)
        return ""

    @property
    def is_ready(self) -> bool:
        if self.engine is None or self.is_dead:
            return False
        return self.engine.is_ready

    def loop_status(self) -> dict[str, object] | None:
        """The engine loop's state (idle, running, dead) and seconds since its last
        heartbeat."""
        if self.engine is None:
            return None
        return {
            "state": self.engine.loop_state,
            "heartbeat_age_s": round(self.engine.heartbeat_age_s, 3),
        }

    def replicas(self) -> tuple[int, int] | None:
        """``(live, configured)`` replicas of a loaded engine; None while it loads."""
        if self.engine is None:
            return None
        return self.engine.replicas_live, self.engine.num_replicas

    def stages(self) -> list[dict[str, Any]] | None:
        """Each stage's live and configured replicas (a staged topology), None while
        loading."""
        return self.engine.stage_health if self.engine is not None else None

    def replicas_live(self) -> float:
        """For the gauge: 0 while loading, after a failed load and once the engine is
        dead."""
        if self.engine is None or self.is_dead:
            return 0.0
        return float(self.engine.replicas_live)

    def load(self) -> ModelLoad:
        """The engine's queue, running requests and outstanding work (all zero while it
        loads)."""
        return self.engine.load if self.engine is not None else ModelLoad()

    def queue_depth(self) -> float:
        if self.engine is None:
            return 0.0
        return float(self.engine.queue_depth)

    def require(self) -> AsyncEngineClient:
        """The engine, or the error a request must get (503) when it cannot be
        served."""
        if self.load_error is not None:
            raise EngineDeadError(
                f"the engine failed to load: {type(self.load_error).__name__}: "
                f"{self.load_error}"
            )
        if self.engine is None or not self.is_ready:
            if self.is_dead:
                raise EngineDeadError(
                    f"the engine is dead ({self.death_reason() or 'a worker exited'}); "
                    "restart the server"
                )
            raise EngineNotReadyError("the model is still loading; poll GET /ready")
        return self.engine

    async def shutdown(self) -> None:
        if self._load_task is not None and not self._load_task.done():
            # A thread cannot be interrupted: wait for the build to finish so its
            # workers get shut down.
            # Already logged by _load.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._load_task
        if self.engine is None:
            return
        # Stopping workers joins threads/processes: blocking, so off the loop like
        # loading.
        await asyncio.to_thread(self.engine.shutdown)
