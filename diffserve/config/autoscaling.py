"""The rules across the keys of ``server.autoscaling`` (the Ray Serve front's replicas):
each key alone is checked by its normalizer at ingress; these compare two keys, and name
the one that should change."""

from __future__ import annotations

from collections.abc import Mapping

from diffserve.config.provenance import DEFAULT_SOURCE, Source
from diffserve.config.server_schema import AutoscalingConfig
from diffserve.errors import ConfigError

_PREFIX = "server.autoscaling"


def autoscaling_errors(
    autoscaling: AutoscalingConfig, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """``min_replicas`` above ``max_replicas``, and a look-back window no longer than
    one metrics interval (Ray Serve would average over a single report, so one burst
    would decide the replica count)."""

    def source(key: str) -> Source:
        return provenance.get(f"{_PREFIX}.{key}", DEFAULT_SOURCE)

    def written(key: str) -> bool:
        return source(key).layer != DEFAULT_SOURCE.layer

    errors = []
    low, high = autoscaling.min_replicas, autoscaling.max_replicas
    if low > high:
        # Point at a line the operator wrote: with max_replicas left at its default,
        # that is min_replicas.
        key = "max_replicas" if written("max_replicas") else "min_replicas"
        errors.append(
            ConfigError(
                f"min_replicas {low} is above max_replicas {high}",
                path=f"{_PREFIX}.{key}",
                source=source(key).describe(),
                hint=f"set {_PREFIX}.max_replicas to at least {low}, or min_replicas "
                f"to at most {high}",
            )
        )
    window, interval = autoscaling.look_back_period_s, autoscaling.metrics_interval_s
    if window <= interval:
        key = (
            "look_back_period_s"
            if written("look_back_period_s")
            else "metrics_interval_s"
        )
        errors.append(
            ConfigError(
                f"look_back_period_s {window:g} is not longer than metrics_interval_s "
                f"{interval:g}: a scaling decision "
                "would read a single report",
                path=f"{_PREFIX}.{key}",
                source=source(key).describe(),
                hint=f"set {_PREFIX}.look_back_period_s to a few metrics "
                f"intervals (e.g. {3 * interval:g})",
            )
        )
    return errors
