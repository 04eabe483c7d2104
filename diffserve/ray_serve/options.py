"""The Ray Serve deployment options of a diffserve front, from the resolved config (no
Ray import: a plain mapping, the same for ``diffserve serve --ray-serve`` and ``serve
run diffserve.ray_serve:app``).

* ``autoscaling_config``: ``server.autoscaling``, key for key, plus ``initial_replicas``
  = ``min_replicas`` (a
  deployment starts at its floor and scales up on load).
* ``max_ongoing_requests``: what one replica accepts at once, twice the target and at
  least one more than it.
  Above the target, so the load Ray Serve measures can exceed the target and ask for a
  replica; bounded, so a replica does not take requests another replica could start at
  once (its own engine would queue them).
* ``max_queued_requests``: ``server.max_queue``, requests waiting at the proxy for a
  replica with room (503 past
  it, as the engine's queue answers 429 past its own).
* ``graceful_shutdown_timeout_s``: ``server.batch_deadline_floor_s``: a replica removed
  by a downscale finishes the
  requests it holds; a batch running longer than that counts as hung anyway.
* ``ray_actor_options``: one CPU per replica, and on a CUDA/ROCm platform one GPU per
  rank of its engines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from diffserve.config.resolved import ResolvedConfig
from diffserve.config.server_schema import AutoscalingConfig
from diffserve.executor.ray_env import worker_env

# The platforms whose ranks each take a GPU (Ray's "GPU" resource covers both vendors'
# devices).
_GPU_PLATFORMS = frozenset({"cuda", "rocm"})


def autoscaling_config(autoscaling: AutoscalingConfig) -> dict[str, Any]:
    """Ray Serve's ``autoscaling_config`` of ``server.autoscaling``."""
    return {
        "min_replicas": autoscaling.min_replicas,
        "initial_replicas": autoscaling.min_replicas,
        "max_replicas": autoscaling.max_replicas,
        "target_ongoing_requests": float(autoscaling.target_ongoing_requests),
        "upscale_delay_s": autoscaling.upscale_delay_s,
        "downscale_delay_s": autoscaling.downscale_delay_s,
        "metrics_interval_s": autoscaling.metrics_interval_s,
        "look_back_period_s": autoscaling.look_back_period_s,
    }


def max_ongoing_requests(autoscaling: AutoscalingConfig) -> int:
    target = autoscaling.target_ongoing_requests
    return max(2 * target, target + 1)


def ray_actor_options(configs: Sequence[ResolvedConfig]) -> dict[str, Any]:
    """What one replica asks Ray for: it runs the engines of every model of
    ``configs``."""
    gpus = sum(
        stage.parallel.world_size * stage.num_replicas
        for config in configs
        if config.platform in _GPU_PLATFORMS
        for stage in config.stages
    )
    options: dict[str, Any] = {"num_cpus": 1, "runtime_env": {"env_vars": worker_env()}}
    if gpus:
        options["num_gpus"] = gpus
    return options


def deployment_options(
    configs: Sequence[ResolvedConfig], actor_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``serve.deployment(...)``'s keywords for a front serving ``configs`` (the first
    model's ``server.*`` are the server's, as ``create_app`` reads them);
    ``actor_options`` replace the derived ``ray_actor_options`` keys."""
    server = configs[0].server
    return {
        "autoscaling_config": autoscaling_config(server.autoscaling),
        "max_ongoing_requests": max_ongoing_requests(server.autoscaling),
        "max_queued_requests": server.max_queue,
        "graceful_shutdown_timeout_s": float(server.batch_deadline_floor_s),
        "ray_actor_options": {**ray_actor_options(configs), **(actor_options or {})},
    }
