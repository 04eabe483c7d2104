"""``ResolvedConfig``: the frozen, picklable result of ``resolve()`` that is passed down
explicitly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from diffserve.config.ar_schema import ArStageConfig
from diffserve.config.model_source import ModelSource
from diffserve.config.provenance import Source
from diffserve.config.schema import FrozenDict, StageConfig
from diffserve.config.server_schema import ServerConfig
from diffserve.errors import ConfigError


@dataclass(frozen=True)
class ResolvedConfig:
    """Per-stage complete values, where each came from, and a fingerprint of the
    effective values."""

    model: str | None
    # model_index.json "_class_name" of ``model``: the key of its entry in
    # registry.models.MODEL_FAMILIES.
    model_family: str | None
    topology: str
    platform: str
    server: ServerConfig
    stages: tuple[StageConfig, ...]
    fingerprint: str = ""
    provenance: Mapping[str, Source] = field(default_factory=FrozenDict)
    warnings: tuple[str, ...] = ()
    deploy_files: tuple[str, ...] = ()
    # Where the ray executor runs ("" local, "auto", or an address); other executors
    # ignore it.
    ray_address: str = ""
    # What ``model`` was given as and where (a hub id with its repository, revision and
    # commit).
    model_source: ModelSource | None = None
    # The autoregressive LLM stages that run before the diffusion stages (stage_ids
    # 0..N-1), on vLLM.
    ar_stages: tuple[ArStageConfig, ...] = ()

    def stage(self, stage_id: int) -> StageConfig:
        for stage in self.stages:
            if stage.stage_id == stage_id:
                return stage
        raise ConfigError(
            f"no stage {stage_id} in topology {self.topology!r}", path="stage_id"
        )

    def stage_for_role(self, role: str) -> StageConfig:
        for stage in self.stages:
            if stage.role == role:
                return stage
        roles = ", ".join(s.role for s in self.stages)
        raise ConfigError(
            f"topology {self.topology!r} has no {role!r} stage (it has: {roles})",
            path="role",
        )

    def source_of(self, key: str) -> Source:
        """Provenance of a dotted key such as ``stages.0.linear_backend``; defaults are
        ``default``."""
        return self.provenance.get(key, Source("default"))

    def is_explicit(self, key: str) -> bool:
        """True when some layer set the value (a default, the platform's included, is
        never explicit)."""
        return self.source_of(key).layer not in ("default", "platform-default")
