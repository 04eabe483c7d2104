"""What a Ray Serve replica is built from: plain, picklable data (Ray ships it to every
replica, and to replicas started long after the driver resolved it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from diffserve.config.resolved import ResolvedConfig
from diffserve.entrypoints.openai.served import ModelServing

# the Serve application (and its one deployment): `serve status` lists it under this
# name
APP_NAME = "diffserve"


@dataclass(frozen=True)
class ServedSpec:
    """One model of the front: its resolved config (resolved once, by the driver) and
    its names."""

    name: str
    config: ResolvedConfig
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplicaSpec:
    """Every replica serves every model, with the server's settings of ``diffserve
    serve``."""

    models: tuple[ServedSpec, ...]
    api_key: str | None = None
    image_ttl_s: float = 600.0

    @property
    def configs(self) -> list[ResolvedConfig]:
        return [model.config for model in self.models]


def replica_spec(
    models: Sequence[ModelServing], *, api_key: str | None, image_ttl_s: float
) -> ReplicaSpec:
    """The spec of ``serving_models``' result; each replica builds its own engines from
    the configs."""
    served = []
    for model in models:
        if model.config is None:
            raise ValueError(
                f"model {model.name!r} has no resolved config: a replica "
                "builds its engine from one"
            )
        served.append(ServedSpec(model.name, model.config, tuple(model.aliases)))
    return ReplicaSpec(tuple(served), api_key, image_ttl_s)
