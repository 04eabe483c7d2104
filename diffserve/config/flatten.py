"""Dotted key -> value views of the resolved sections (what explain shows and the
fingerprint hashes)."""

from __future__ import annotations

import dataclasses
from typing import Any

from diffserve.config.ar_schema import ArStageConfig
from diffserve.config.schema import StageConfig
from diffserve.config.server_schema import ServerConfig


def flatten_stage(stage: StageConfig) -> dict[str, Any]:
    """Dotted key -> value of every setting of a stage (roles and extras one key
    each)."""
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
    """``server.<key>`` -> value; a nested section one key per leaf
    (``server.autoscaling.min_replicas``)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(server):
        value = getattr(server, f.name)
        if dataclasses.is_dataclass(value):
            values.update(
                {
                    f"server.{f.name}.{sub.name}": getattr(value, sub.name)
                    for sub in dataclasses.fields(value)
                }
            )
        else:
            values[f"server.{f.name}"] = value
    return values


def flatten_ar_stage(stage: ArStageConfig) -> dict[str, Any]:
    """An AR stage's keys as its deploy entry writes them: diffserve's, then vLLM's flat
    engine settings."""
    values: dict[str, Any] = {"kind": "ar"}
    for f in dataclasses.fields(stage):
        if f.name not in ("stage_id", "engine_args"):
            value = getattr(stage, f.name)
            values[f.name] = (
                dict(value)
                if f.name in ("default_sampling_params", "kv_connector_extra_config")
                else value
            )
    values.update(stage.engine_args)
    return values
