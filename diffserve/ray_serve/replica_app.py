"""The FastAPI app of one Ray Serve replica: the app ``diffserve serve`` builds
(``create_app``, over engines of this replica's own), with two additions.

* Its lifespan startup ends only once every model's engine is loaded and ready. Ray
  Serve routes requests to a
  replica once its startup has ended, and autoscaling adds replicas exactly when
  requests are waiting: a replica that took traffic while loading would answer them 503
  ("still loading"). A model that fails to load fails the startup, and Serve retries the
  replica.
* ``GET /ray-serve/status``: the deployment's replicas per state as Ray Serve's
  controller reports them
  (``serve.status()``), and which replica answered.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from diffserve.entrypoints.openai.app import create_app
from diffserve.entrypoints.openai.served import ServedModel
from diffserve.entrypoints.served_models import model_serving
from diffserve.logging import get_logger
from diffserve.ray_serve.spec import ReplicaSpec

logger = get_logger(__name__)

STATUS_PATH = "/ray-serve/status"
_READY_POLL_S = 0.1


@dataclass(frozen=True)
class ReplicaIdentity:
    """Where this replica sits in Ray Serve (``serve.get_replica_context()``)."""

    app_name: str
    deployment: str
    replica: str  # the replica's id, unique within its deployment


def build_replica_app(spec: ReplicaSpec, identity: ReplicaIdentity) -> FastAPI:
    models = [
        model_serving(model.name, model.config, model.aliases) for model in spec.models
    ]
    app = create_app(
        models=models,
        api_key=spec.api_key,
        image_ttl_s=spec.image_ttl_s,
        instance_name=f"{socket.gethostname()}:ray-serve:{identity.replica}",
    )
    _ready_before_traffic(app)
    _add_status_route(app, identity)
    return app


def _ready_before_traffic(app: FastAPI) -> None:
    """Wrap the app's lifespan: startup (which begins the engines' loads) then waits for
    every model."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        async with inner(application) as state:
            await wait_until_ready(app.state.models)
            yield state

    app.router.lifespan_context = lifespan


async def wait_until_ready(models: Iterable[ServedModel]) -> None:
    """Return once every model's engine is ready; raise when one cannot serve (its load
    failed, it died)."""
    for model in models:
        await model.host.wait_loaded()
        while not model.host.is_ready:
            if model.host.is_dead:
                raise RuntimeError(
                    f"model {model.name!r} cannot serve: {model.host.death_reason()}"
                )
            await asyncio.sleep(_READY_POLL_S)
        logger.info("ray serve replica: model %r is ready", model.name)


def _add_status_route(app: FastAPI, identity: ReplicaIdentity) -> None:
    @app.get(STATUS_PATH)
    async def ray_serve_status() -> dict[str, Any]:
        from ray import serve

        # A blocking call to Serve's controller: off the event loop, which serves the
        # replica's requests.
        status = await asyncio.to_thread(serve.status)
        application = status.applications.get(identity.app_name)
        deployment = (
            application.deployments.get(identity.deployment)
            if application is not None
            else None
        )
        replicas = (
            {_name(state): count for state, count in deployment.replica_states.items()}
            if deployment
            else {}
        )
        return {
            "application": identity.app_name,
            "deployment": identity.deployment,
            "replica": identity.replica,
            "status": _name(deployment.status) if deployment else None,
            "replicas": replicas,
            "running_replicas": replicas.get("RUNNING", 0),
        }


def _name(state: Any) -> str:
    """An enum member's value (Serve's states are str enums), else the text."""
    return str(getattr(state, "value", state))
