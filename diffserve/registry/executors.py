"""Executors by name: how the ranks of a stage are started and reached.

``config`` derives the allowed ``distributed_executor_backend`` values and the
world-size rule from this table; ``executor.factory.make_executor`` imports the chosen
class lazily. Adding an executor is one entry here plus one module under
``diffserve/executor/`` subclassing ``executor.base.Executor``.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffserve.registry.targets import spelling_table


@dataclass(frozen=True)
class ExecutorSpec:
    name: str
    target: str  # "module:Class" of the Executor subclass
    max_world_size: int | None  # most ranks per replica; None: any
    doc: str
    # A module the executor needs that diffserve does not install by default, and the
    # extra that installs it: choosing the executor without it is a ConfigError at
    # resolve time (config/requirements.py).
    requires: str | None = None
    extra: str | None = None


EXECUTORS: dict[str, ExecutorSpec] = {
    spec.name: spec
    for spec in (
        ExecutorSpec(
            "uni",
            "diffserve.executor.uni:UniExecutor",
            1,
            "the worker on a thread of this process",
        ),
        ExecutorSpec(
            "mp",
            "diffserve.executor.mp:MultiprocExecutor",
            None,
            "one spawned process per rank",
        ),
        ExecutorSpec(
            "ray",
            "diffserve.executor.ray:RayExecutor",
            None,
            "one Ray actor per rank, in a placement group (one bundle per rank)",
            requires="ray",
            extra="ray",
        ),
    )
}
EXECUTOR_ALIASES: dict[str, str] = {"multiprocessing": "mp"}


def executor_spellings() -> dict[str, str]:
    return spelling_table(list(EXECUTORS), EXECUTOR_ALIASES)
