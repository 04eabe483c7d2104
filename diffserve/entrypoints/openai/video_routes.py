"""The ``/v1/videos`` routes of a server with a video model, and the job store, artifact
directory and runner behind them (``entrypoints/jobs``), built from the deployment's
``server.*`` settings."""

from __future__ import annotations

import os
import socket

from fastapi import FastAPI, Request
from fastapi.responses import Response

from diffserve.config.server_schema import ServerConfig
from diffserve.entrypoints.jobs.runner import JobRunner, RunnerSettings
from diffserve.entrypoints.jobs.setup import open_artifacts, open_job_store
from diffserve.entrypoints.openai.answers import answered
from diffserve.entrypoints.openai.metrics import ServerMetrics
from diffserve.entrypoints.openai.served import ServedModels
from diffserve.entrypoints.openai.video_protocol import video_object
from diffserve.entrypoints.openai.videos import VIDEOS_PATH, VideosHandler
from diffserve.entrypoints.openai.webhook_routes import add_webhook_routes
from diffserve.entrypoints.provenance_keys import signer_for
from diffserve.entrypoints.webhooks.setup import Webhooks, configured

__all__ = ["VIDEOS_PATH", "add_video_routes", "video_jobs"]


def video_jobs(
    models: ServedModels,
    server: ServerConfig,
    instance_name: str | None,
    metrics: ServerMetrics | None = None,
) -> VideosHandler | None:
    """The videos API of a server with a video model (None when every model makes
    images), one job store and runner for all its video models. ``instance_name``: this
    instance's name in the store's leases, stable across its restarts (``diffserve
    serve``: host and port), so a restarted instance recognises the jobs its previous
    run left unfinished."""
    hosts = {model.name: model.host for model in models if model.makes == "videos"}
    if not hosts:
        return None
    store = open_job_store(server)
    artifacts = open_artifacts(server)
    settings = RunnerSettings(
        owner=instance_name or f"{socket.gethostname()}:{os.getpid()}",
        lease_s=float(server.job_lease_s),
        deadline_s=float(server.job_deadline_s),
        ttl_s=float(server.video_ttl_s),
        requeue=server.requeue_interrupted,
        signer=signer_for(server),
    )
    runner = JobRunner(store, artifacts, hosts, settings)
    webhooks = None
    if configured(server.webhooks):
        webhooks = Webhooks(
            store,
            server.webhooks,
            owner=settings.owner,
            render=video_object,
            on_outcome=metrics.webhook_outcome if metrics is not None else None,
        )
    return VideosHandler(
        models,
        store,
        artifacts,
        runner,
        max_pixels=server.max_pixels,
        max_field_bytes=max(65536, 4 * server.max_prompt_chars + 1024),
        webhooks=webhooks,
    )


def add_video_routes(app: FastAPI, videos: VideosHandler) -> None:
    @app.post(VIDEOS_PATH)
    async def create_video(request: Request) -> Response:
        return await answered(request, lambda: videos.create(request))

    @app.get(VIDEOS_PATH)
    async def list_videos(request: Request) -> Response:
        return await answered(request, lambda: videos.list(request))

    @app.get(VIDEOS_PATH + "/{video_id}")
    async def retrieve_video(video_id: str, request: Request) -> Response:
        return await answered(request, lambda: videos.retrieve(video_id))

    @app.delete(VIDEOS_PATH + "/{video_id}")
    async def delete_video(video_id: str, request: Request) -> Response:
        return await answered(request, lambda: videos.delete(video_id))

    @app.get(VIDEOS_PATH + "/{video_id}/content")
    async def video_content(video_id: str, request: Request) -> Response:
        return await answered(request, lambda: videos.content(video_id, request))

    if videos.webhooks is not None:
        add_webhook_routes(app, videos.webhooks)
