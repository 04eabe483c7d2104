"""Where a value came from (``Source``), one sourced value (``Assignment``) and the
layer ranks.

Every source turns its input into a flat list of assignments; the resolver picks, per
stage and leaf key, the assignment with the highest ``(rank, is_stage_scoped)``. The
ranks below ARE the precedence order; nothing else orders layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diffserve.errors import ConfigError

# Precedence, low to high. Defaults are not a rank: they fill what no layer set,
# recorded as "default".
LAYER_RANK: dict[str, int] = {
    "model": 100,
    "yaml": 200,  # + position in the base_config chain (ancestors lower)
    "platform": 400,  # + position in the base_config chain
    "env": 600,
    "cli": 700,
    "cli_stage": 800,
}
MAX_CHAIN = 64  # base_config chain length; keeps yaml ranks below platform ranks
# "platform-default" (config/platform_defaults.py) also fills only what no layer set,
# and is never explicit.
LAYERS: tuple[str, ...] = ("default", "platform-default", *LAYER_RANK)


@dataclass(frozen=True)
class Source:
    """``layer`` is one of LAYERS; ``file``/``line`` locate YAML values; ``detail``
    names a flag/env var."""

    layer: str
    file: str | None = None
    line: int | None = None
    detail: str | None = None

    @property
    def location(self) -> str | None:
        """``file:line`` for file values, else None."""
        if self.file is None:
            return None
        return f"{self.file}:{self.line}" if self.line else self.file

    def describe(self) -> str:
        """Short human form used in errors and warnings."""
        if self.location:
            return self.location
        return f"{self.layer} {self.detail}" if self.detail else self.layer


DEFAULT_SOURCE = Source("default")


@dataclass(frozen=True)
class Assignment:
    rank: int
    stage_id: int | None  # None: pipeline-wide (every stage, or a pipeline-only key)
    key: str  # leaf key: "dtype", "parallel.ring_degree", "extras.foo", "server.max_n"
    value: Any  # canonical
    source: Source


@dataclass
class StageRef:
    """A place that names a stage_id; checked against the topology once it is known."""

    stage_id: int
    source: Source
    path: str


@dataclass
class Collector:
    """What the sources produced: assignments, stage references and every error
    found."""

    assignments: list[Assignment] = field(default_factory=list)
    stage_refs: list[StageRef] = field(default_factory=list)
    errors: list[ConfigError] = field(default_factory=list)
    # A deploy file's ``model:`` (the nearest file's): its text and where it was
    # written.
    deploy_model: tuple[str, Source] | None = None
    # The stage ids some document declared ``kind: ar`` (config/ar_ingest.py).
    ar_stage_ids: set[int] = field(default_factory=set)

    def add(
        self, rank: int, stage_id: int | None, key: str, value: Any, source: Source
    ) -> None:
        self.assignments.append(Assignment(rank, stage_id, key, value, source))

    def error(
        self,
        message: str,
        *,
        path: str | None,
        source: Source | str | None,
        hint: str | None = None,
    ) -> None:
        where = source.describe() if isinstance(source, Source) else source
        self.errors.append(ConfigError(message, path=path, source=where, hint=hint))

    def fail(self, exc: ConfigError, *, path: str | None, source: Source) -> None:
        """Re-raise a normalizer's error with the key path and location attached."""
        self.error(exc.rule, path=path, source=source, hint=exc.hint)
