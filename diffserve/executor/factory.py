"""Build the executor a stage's ``distributed_executor_backend`` names, from
``registry.executors``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diffserve.config.layout import require_runnable
from diffserve.errors import ConfigError
from diffserve.executor.base import Executor
from diffserve.registry.executors import EXECUTORS
from diffserve.registry.targets import load_target

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig


def make_executor(
    config: ResolvedConfig,
    stage_id: int | None = None,
    *,
    replica: int = 0,
    **kwargs: Any,
) -> Executor:
    """Replica ``replica`` of stage ``stage_id`` (default: the diffusion stage),
    imported only when chosen.

    A world size the executor or the model family cannot run is a ``ConfigError`` here
    (``config/layout.py``), never a silent downgrade; ``kwargs`` go to the constructor
    (``ready_timeout``). The engine calls it once per replica (``engine/replicas.py``).
    """
    stage = (
        config.stage_for_role("diffusion")
        if stage_id is None
        else config.stage(stage_id)
    )
    require_runnable(config, stage)
    spec = EXECUTORS.get(stage.distributed_executor_backend)
    if spec is None:  # only reachable with a hand-built config that bypassed resolve()
        raise ConfigError(
            f"executor {stage.distributed_executor_backend!r} is not registered",
            path=f"stages.{stage.stage_id}.distributed_executor_backend",
            hint=f"use one of {', '.join(EXECUTORS)}",
        )
    cls = load_target(spec.target)
    if not (isinstance(cls, type) and issubclass(cls, Executor)):
        raise TypeError(
            f"registry entry {spec.name!r} -> {spec.target} is not an Executor subclass"
        )
    return cls(config, stage.stage_id, replica=replica, **kwargs)
