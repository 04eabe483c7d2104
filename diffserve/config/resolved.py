"""``ResolvedConfig``: the frozen, picklable result of ``resolve()`` that is passed down explicitly."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diffserve.config.provenance import Source
from diffserve.config.schema import FrozenDict, ServerConfig, StageConfig
from diffserve.errors import ConfigError


def flatten_stage(stage: StageConfig) -> dict[str, Any]:
    """Dotted key -> value of every setting of a stage (roles and extras one key each)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(stage):
        if f.name in ("stage_id",):
            continue
        value = getattr(stage, f.name)
        if f.name == "attention_backend":
            values["attention_backend.default"] = value.default
            for role, name in sorted(value.roles.items()):
                values[f"attention_backend.{role}"] = name
        elif f.name == "extras":
            for key, item in sorted(value.items()):
                values[f"extras.{key}"] = item
        elif dataclasses.is_dataclass(value):
            for sub in dataclasses.fields(value):
                values[f"{f.name}.{sub.name}"] = getattr(value, sub.name)
        else:
            values[f.name] = value
    return values


def flatten_server(server: ServerConfig) -> dict[str, Any]:
    return {f"server.{f.name}": getattr(server, f.name) for f in dataclasses.fields(server)}


@dataclass(frozen=True)
class ResolvedConfig:
    """Per-stage complete values, where each came from, and a fingerprint of the effective values."""

    model: str | None
    topology: str
    platform: str
    server: ServerConfig
    stages: tuple[StageConfig, ...]
    fingerprint: str = ""
    provenance: Mapping[str, Source] = field(default_factory=FrozenDict)
    warnings: tuple[str, ...] = ()
    deploy_files: tuple[str, ...] = ()

    def stage(self, stage_id: int) -> StageConfig:
        for stage in self.stages:
            if stage.stage_id == stage_id:
                return stage
        raise ConfigError(f"no stage {stage_id} in topology {self.topology!r}", path="stage_id")

    def stage_for_role(self, role: str) -> StageConfig:
        for stage in self.stages:
            if stage.role == role:
                return stage
        roles = ", ".join(s.role for s in self.stages)
        raise ConfigError(f"topology {self.topology!r} has no {role!r} stage (it has: {roles})", path="role")

    def source_of(self, key: str) -> Source:
        """Provenance of a dotted key such as ``stages.0.linear_backend``; defaults are ``default``."""
        return self.provenance.get(key, Source("default"))

    def is_explicit(self, key: str) -> bool:
        """True when some layer set the value (a default is never explicit)."""
        return self.source_of(key).layer != "default"

    def to_explain_dict(self) -> dict[str, Any]:
        from diffserve.config.explain import explain_dict

        return explain_dict(self)
