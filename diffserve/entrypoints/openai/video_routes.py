"""The ``/v1/videos`` routes of a server with a video model, and the job store, artifact directory and
runner behind them (``entrypoints/jobs``), built from the deployment's ``server.*`` settings."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from diffserve.config.schema import ServerConfig
from diffserve.entrypoints.api_errors import request_id_from, to_api_error
from diffserve.entrypoints.jobs.runner import JobRunner, RunnerSettings
from diffserve.entrypoints.jobs.setup import open_artifacts, open_job_store
from diffserve.entrypoints.openai.served import ServedModels
from diffserve.entrypoints.openai.videos import VIDEOS_PATH, VideosHandler

__all__ = ["VIDEOS_PATH", "add_video_routes", "video_jobs"]


def video_jobs(models: ServedModels, server: ServerConfig, instance_name: str | None) -> VideosHandler | None:
    """The videos API of a server with a video model (None when every model makes images), one job store and
    runner for all its video models. ``instance_name``: this instance's name in the store's leases, stable across
    its restarts (``diffserve serve``: host and port), so a restarted instance recognises the jobs its previous
    run left unfinished."""
    hosts = {model.name: model.host for model in models if model.makes == "videos"}
    if not hosts:
        return None
    store = open_job_store(server)
    artifacts = open_artifacts(server)
    settings = RunnerSettings(owner=instance_name or f"{socket.gethostname()}:{os.getpid()}",
                              lease_s=float(server.job_lease_s), deadline_s=float(server.job_deadline_s),
                              ttl_s=float(server.video_ttl_s), requeue=server.requeue_interrupted)
    runner = JobRunner(store, artifacts, hosts, settings)
    return VideosHandler(models, store, artifacts, runner, max_pixels=server.max_pixels,
                         max_field_bytes=max(65536, 4 * server.max_prompt_chars + 1024))


def add_video_routes(app: FastAPI, videos: VideosHandler) -> None:
    def answered(call: Callable[[], Awaitable[Response]], request: Request) -> Awaitable[Response]:
        async def run() -> Response:
            try:
                return await call()
            except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI-shaped error
                error = to_api_error(exc, request_id_from(request.headers.get("x-request-id")))
                return JSONResponse(error.body(), status_code=error.status, headers=error.headers())
        return run()

    @app.post(VIDEOS_PATH)
    async def create_video(request: Request) -> Response:
        return await answered(lambda: videos.create(request), request)

    @app.get(VIDEOS_PATH)
    async def list_videos(request: Request) -> Response:
        return await answered(lambda: videos.list(request), request)

    @app.get(VIDEOS_PATH + "/{video_id}")
    async def retrieve_video(video_id: str, request: Request) -> Response:
        return await answered(lambda: videos.retrieve(video_id), request)

    @app.delete(VIDEOS_PATH + "/{video_id}")
    async def delete_video(video_id: str, request: Request) -> Response:
        return await answered(lambda: videos.delete(video_id), request)

    @app.get(VIDEOS_PATH + "/{video_id}/content")
    async def video_content(video_id: str, request: Request) -> Response:
        return await answered(lambda: videos.content(video_id, request), request)
