"""``EngineClient``: what the HTTP server and the CLI may rely on, whichever engine they
hold.

``Engine`` (blocking ``generate``) and ``AsyncEngine`` (async ``generate``) both
implement ``EngineClient``; ``AsyncEngineClient`` adds the asyncio request API the
server and ``diffserve generate`` use. Entry points depend on these protocols, never on
``Any`` or on probing attributes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.engine.load import ModelLoad
    from diffserve.engine.stats import BatchStats
    from diffserve.types.capabilities import PipelineCapabilities
    from diffserve.types.memory import ComponentWeights
    from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput


@runtime_checkable
class EngineClient(Protocol):
    """State, workers, stats and lifetime of a running engine."""

    @property
    def config(self) -> ResolvedConfig: ...

    @property
    def executor_name(self) -> str: ...

    @property
    def weights(self) -> dict[str, ComponentWeights]:
        """Each loaded component's weights on its device (one replica's: every replica
        loads the same)."""
        ...

    @property
    def is_ready(self) -> bool: ...

    @property
    def is_dead(self) -> bool: ...

    @property
    def heartbeat_age_s(self) -> float:
        """Seconds since the stalest live replica loop last beat (each beats every ~0.5
        s while idle)."""
        ...

    @property
    def loop_state(self) -> str:
        """``idle``, ``running`` or ``dead``."""
        ...

    @property
    def num_replicas(self) -> int:
        """Replicas configured (``num_replicas``)."""
        ...

    @property
    def replicas_live(self) -> int:
        """Replicas still serving; below ``num_replicas`` the engine is degraded, at 0
        it is dead."""
        ...

    @property
    def stage_health(self) -> list[dict[str, Any]]:
        """Per stage: ``stage_id``, ``role``, ``replicas_live``, ``replicas``."""
        ...

    @property
    def queue_depth(self) -> int: ...

    @property
    def load(self) -> ModelLoad:
        """Queue, running requests and outstanding work, in total and per replica
        (``engine/load.py``)."""
        ...

    def check_health(self) -> None: ...

    def admit(self, request: GenerationRequest) -> GenerationRequest:
        """The request as admission makes it (defaults, seed), or its 400/422 error;
        nothing runs."""
        ...

    @property
    def capabilities(self) -> PipelineCapabilities | None:
        """What the loaded pipeline serves (None while loading)."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def add_stats_listener(self, listener: Callable[[BatchStats], None]) -> None: ...

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> list[Any]: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class AsyncEngineClient(EngineClient, Protocol):
    """An engine whose requests are awaited (what the HTTP server and the CLI drive)."""

    def generate(
        self, request: GenerationRequest
    ) -> AsyncIterator[ProgressEvent | RequestOutput]:
        """Progress events, then the output; closing the iterator early aborts the
        request."""
        ...

    async def abort(self, request_id: str) -> bool: ...
