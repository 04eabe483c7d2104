"""The FastAPI application factory of the OpenAI-compatible server.

``create_app`` wires the engine host (background load + readiness), the images and edits
handlers, the probes, metrics and config endpoints, and the pre-parsing middleware
(metrics, API key, body size).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from diffserve import __version__
from diffserve.config.resolved import ResolvedConfig
from diffserve.config.server_schema import ServerConfig
from diffserve.engine.client import AsyncEngineClient
from diffserve.entrypoints.api_errors import APIError
from diffserve.entrypoints.engine_host import EngineFactory, EngineHost
from diffserve.entrypoints.openai.answers import answered, error_of, error_response
from diffserve.entrypoints.openai.edits import EDITS_PATH, EditsHandler
from diffserve.entrypoints.openai.image_store import ImageStore
from diffserve.entrypoints.openai.images import ImagesHandler
from diffserve.entrypoints.openai.metrics import CONTENT_TYPE, ServerMetrics
from diffserve.entrypoints.openai.middleware import (
    APIKeyMiddleware,
    BodyLimitMiddleware,
    HostMiddleware,
    MetricsMiddleware,
    RouteGuardMiddleware,
    endpoint_label,
)
from diffserve.entrypoints.openai.model_routes import add_model_routes
from diffserve.entrypoints.openai.playground import PlaygroundMiddleware
from diffserve.entrypoints.openai.served import (
    ModelServing,
    ServedModel,
    ServedModels,
    makes_of,
)
from diffserve.entrypoints.openai.video_routes import (
    VIDEOS_PATH,
    add_video_routes,
    video_jobs,
)
from diffserve.logging import get_logger
from diffserve.tracing.asgi import TracingMiddleware
from diffserve.tracing.provider import start_tracing, stop_tracing

logger = get_logger(__name__)


def create_app(
    engine: AsyncEngineClient | None = None,
    *,
    engine_factory: EngineFactory | None = None,
    config: ResolvedConfig | None = None,
    served_model_name: str = "diffserve",
    model_aliases: tuple[str, ...] = (),
    models: Sequence[ModelServing] | None = None,
    api_key: str | None = None,
    image_ttl_s: float = 600.0,
    instance_name: str | None = None,
) -> FastAPI:
    """Build the app around one model (a ready ``engine`` or an ``engine_factory`` that
    builds one after startup, named ``served_model_name``) or several (``models``, each
    its own engine; the first is the default).

    ``config`` is the ``ResolvedConfig`` the engine is built from; given an engine, its
    own ``.config`` is the default. The server-wide settings (``server.*``: body limits,
    API key paths, the job store) are the first model's. The request limits
    (``server.max_n`` ...) are each engine's to check, at admission, which also fills
    unset fields.
    """
    if models is None:
        if config is None and engine is not None:
            config = engine.config
        models = [
            ModelServing(
                served_model_name, engine, engine_factory, config, model_aliases
            )
        ]
    elif engine is not None or engine_factory is not None or config is not None:
        raise ValueError("give models or one engine (or factory), not both")
    metrics = ServerMetrics()
    served = ServedModels([_served(model, metrics) for model in models])
    metrics.bind_models(served)
    first_config = served.first.config
    server = first_config.server if first_config is not None else ServerConfig()
    store = ImageStore(ttl_s=image_ttl_s)
    handler = ImagesHandler(
        served, store, metrics, max_user_chars=server.max_prompt_chars
    )
    edits = EditsHandler(
        handler,
        max_pixels=server.max_pixels,
        max_field_bytes=max(65536, 4 * server.max_prompt_chars + 1024),
    )
    videos = video_jobs(served, server, instance_name, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Tracing, when the OTEL_* environment asks for it: on before any engine (its
        # workers inherit the environment), flushed and off after the last one stopped
        # (docs/deploy.md, "Tracing").
        start_tracing("server")
        previous = None
        for model in served:
            await model.host.start(after=previous)
            previous = model.host
        if videos is not None:
            await videos.start()
        try:
            yield
        finally:
            if videos is not None:
                await videos.stop()
            for model in served:
                await model.host.shutdown()
            await asyncio.to_thread(stop_tracing)

    app = FastAPI(
        title="diffserve",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.models = served
    app.state.host = served.first.host
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        return error_response(
            APIError(
                exc.status_code,
                str(exc.detail),
                code=codes.get(exc.status_code, "http_error"),
            )
        )

    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception) -> JSONResponse:
        return error_of(exc, request)

    @app.post("/v1/images/generations")
    async def generations(request: Request) -> Response:
        return await answered(request, lambda: handler.create(request))

    @app.post(EDITS_PATH)
    async def image_edits(request: Request) -> Response:
        return await answered(request, lambda: edits.create(request))

    if videos is not None:
        add_video_routes(app, videos)

    @app.get("/v1/images/{name}", name="get_image")
    async def get_image(name: str) -> Response:
        item = store.get(name)
        if item is None:
            raise APIError(
                404,
                f"image not found (urls expire after {int(store.ttl_s)} s)",
                param="name",
                code="image_not_found",
            )
        return Response(
            item.data,
            media_type=item.media_type,
            headers={"Cache-Control": f"private, max-age={int(store.ttl_s)}"},
        )

    add_model_routes(app, served, int(time.time()), expose_config=server.expose_config)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    # Added last = runs first: metrics see every response; then Host, the key (so an
    # unknown path without the key is 401, not 404), the route table (404/405), and only
    # then is a body read.
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=server.max_body_bytes,
        timeout_s=server.body_timeout_s,
        uploads={
            EDITS_PATH: server.max_upload_bytes,
            VIDEOS_PATH: server.max_upload_bytes,
        },
        json_uploads=frozenset({VIDEOS_PATH}),
    )
    app.add_middleware(RouteGuardMiddleware, routes=app.router.routes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    # GET / and its files: before the key (the page asks for it)
    app.add_middleware(PlaygroundMiddleware)
    if server.allowed_hosts:
        app.add_middleware(HostMiddleware, allowed=server.allowed_hosts)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    # Outermost: every response has its span.
    app.add_middleware(TracingMiddleware, route_of=endpoint_label)
    return app


def _served(model: ModelServing, metrics: ServerMetrics) -> ServedModel:
    def on_loaded(loaded: AsyncEngineClient) -> None:
        loaded.add_stats_listener(metrics.observe_batch)

    host = EngineHost(engine=model.engine, factory=model.factory, on_loaded=on_loaded)
    config = (
        model.config
        if model.config is not None
        else getattr(model.engine, "config", None)
    )
    return ServedModel(
        model.name,
        frozenset({model.name, *model.aliases}),
        host,
        config,
        makes_of(config),
    )
