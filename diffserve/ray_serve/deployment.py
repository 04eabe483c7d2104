"""The Ray Serve deployment of the diffserve front: each replica is one
``DiffserveReplica`` actor, whose ASGI app is the OpenAI-compatible app of ``diffserve
serve`` over engines of its own (uni executor by default: the worker runs on a thread of
the replica's process, so a replica is one process).

Imports ``ray.serve``: only loaded when a front is built (``diffserve.ray_serve.app``,
``serve --ray-serve``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve import Application

from diffserve.entrypoints.openai.served import ServedModels
from diffserve.ray_serve.options import deployment_options
from diffserve.ray_serve.replica_app import ReplicaIdentity, build_replica_app
from diffserve.ray_serve.spec import APP_NAME, ReplicaSpec


# Late-bound ingress (no app given here): Serve calls __serve_build_asgi_app__ in the
# replica, after the constructor, so the app and its engines are built in the replica's
# process, never pickled from the driver.
@serve.ingress()
class DiffserveReplica:
    def __init__(self, spec: ReplicaSpec) -> None:
        self._spec = spec
        self._models: ServedModels | None = None

    def __serve_build_asgi_app__(self) -> FastAPI:
        context = serve.get_replica_context()
        identity = ReplicaIdentity(
            app_name=context.app_name,
            deployment=context.deployment,
            replica=context.replica_tag,
        )
        app = build_replica_app(self._spec, identity)
        self._models = app.state.models
        return app

    def check_health(self) -> None:
        """Serve calls this periodically; raising marks the replica unhealthy and Serve
        replaces it. A dead engine (its last replica gone, a worker that exited) cannot
        come back in this process."""
        for model in self._models or ():
            if model.host.is_dead:
                raise RuntimeError(
                    f"model {model.name!r} cannot serve: {model.host.death_reason()}"
                )


def build_application(
    spec: ReplicaSpec, actor_options: Mapping[str, Any] | None = None
) -> Application:
    """The Serve application of ``spec``: one deployment, its options from the first
    model's ``server.*`` (``options.py``); ``actor_options`` replace keys of the derived
    ``ray_actor_options``."""
    deployment = serve.deployment(
        DiffserveReplica,
        name=APP_NAME,
        **deployment_options(spec.configs, actor_options),
    )
    return deployment.bind(spec)
