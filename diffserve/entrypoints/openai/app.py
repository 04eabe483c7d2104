"""The FastAPI application factory of the OpenAI-compatible server.

``create_app`` wires the engine host (background load + readiness), the images and edits handlers, the probes,
metrics and config endpoints, and the pre-parsing middleware (metrics, API key, body size).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from diffserve import __version__
from diffserve.config.resolved import ResolvedConfig
from diffserve.config.schema import ServerConfig
from diffserve.engine.client import AsyncEngineClient
from diffserve.entrypoints.openai.config_view import config_view
from diffserve.entrypoints.openai.edits import EDITS_PATH, EditsHandler
from diffserve.entrypoints.openai.engine_host import EngineFactory, EngineHost
from diffserve.entrypoints.openai.errors import (
    APIError,
    engine_dead,
    not_ready,
    request_id_from,
    to_api_error,
)
from diffserve.entrypoints.openai.image_store import ImageStore
from diffserve.entrypoints.openai.images import ImagesHandler
from diffserve.entrypoints.openai.metrics import CONTENT_TYPE, ServerMetrics
from diffserve.entrypoints.openai.middleware import (
    APIKeyMiddleware,
    BodyLimitMiddleware,
    HostMiddleware,
    MetricsMiddleware,
    RouteGuardMiddleware,
)
from diffserve.entrypoints.openai.playground import PlaygroundMiddleware
from diffserve.entrypoints.openai.video_routes import VIDEOS_PATH, add_video_routes, video_jobs
from diffserve.logging import get_logger

logger = get_logger(__name__)


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def create_app(engine: AsyncEngineClient | None = None, *, engine_factory: EngineFactory | None = None,
               config: ResolvedConfig | None = None, served_model_name: str = "diffserve",
               model_aliases: tuple[str, ...] = (), api_key: str | None = None,
               image_ttl_s: float = 600.0, instance_name: str | None = None) -> FastAPI:
    """Build the app around a ready engine, or around a factory that builds one after startup.

    ``config`` is the ``ResolvedConfig`` the engine is built from (``server.max_body_bytes`` and
    ``/v1/config``); given an engine, its own ``.config`` is the default. The request limits
    (``server.max_n`` ...) are the engine's to check, at admission, which also fills unset fields.
    """
    if config is None and engine is not None:
        config = engine.config
    metrics = ServerMetrics()

    def on_loaded(loaded: AsyncEngineClient) -> None:
        loaded.add_stats_listener(metrics.observe_batch)

    host = EngineHost(engine=engine, factory=engine_factory, on_loaded=on_loaded)
    metrics.bind_engine_state(queue_depth=host.queue_depth, ready=lambda: float(host.is_ready),
                              replicas_live=host.replicas_live, stages=host.stages)
    server = config.server if config is not None else ServerConfig()
    store = ImageStore(ttl_s=image_ttl_s)
    names = frozenset({served_model_name, *model_aliases})
    handler = ImagesHandler(host, store, metrics, names, max_user_chars=server.max_prompt_chars)
    edits = EditsHandler(handler, max_pixels=server.max_pixels,
                         max_field_bytes=max(65536, 4 * server.max_prompt_chars + 1024))
    created = int(time.time())
    videos = video_jobs(host, config, served_model_name, names, instance_name)
    makes = "videos" if videos is not None else "images"

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await host.start()
        if videos is not None:
            await videos.runner.start()
        try:
            yield
        finally:
            if videos is not None:
                await videos.runner.stop()
            await host.shutdown()

    app = FastAPI(title="diffserve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.host = host
    app.state.metrics = metrics

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        return error_response(APIError(exc.status_code, str(exc.detail), code=codes.get(exc.status_code,
                                                                                         "http_error")))

    @app.exception_handler(Exception)
    async def _any_error(request: Request, exc: Exception) -> JSONResponse:
        return error_response(to_api_error(exc, request_id_from(request.headers.get("x-request-id"))))

    @app.post("/v1/images/generations")
    async def generations(request: Request) -> Response:
        try:
            return await handler.create(request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI-shaped error
            return error_response(to_api_error(exc, request_id_from(request.headers.get("x-request-id"))))

    @app.post(EDITS_PATH)
    async def image_edits(request: Request) -> Response:
        try:
            return await edits.create(request)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an OpenAI-shaped error
            return error_response(to_api_error(exc, request_id_from(request.headers.get("x-request-id"))))

    if videos is not None:
        add_video_routes(app, videos)

    @app.get("/v1/images/{name}", name="get_image")
    async def get_image(name: str) -> Response:
        item = store.get(name)
        if item is None:
            raise APIError(404, "image not found (urls expire after "
                                f"{int(store.ttl_s)} s)", param="name", code="image_not_found")
        return Response(item.data, media_type=item.media_type,
                        headers={"Cache-Control": f"private, max-age={int(store.ttl_s)}"})

    @app.get("/health")
    async def health() -> Response:
        # Liveness: the process answers; a dead engine fails it so orchestrators restart the server.
        # Replicas taken out leave it 200 ("degraded"): the others still serve, a restart would stop them.
        if host.is_dead:
            return error_response(engine_dead(host.death_reason()))
        replicas = host.replicas()
        if replicas is None:
            return JSONResponse({"status": "ok"})
        live, configured = replicas
        stages = host.stages() or []
        empty = next((s for s in stages if s["replicas_live"] == 0), None)
        if live == 0 or empty is not None:
            where = f"stage {empty['stage_id']} ({empty['role']})" if empty is not None else "the engine"
            return error_response(engine_dead(f"no replica of {where} is live"))
        degraded = live < configured or any(s["replicas_live"] < s["replicas"] for s in stages)
        body: dict[str, Any] = {"status": "degraded" if degraded else "ok", "replicas_live": live,
                                "replicas": configured}
        if len(stages) > 1:  # a staged topology: each stage's replicas
            body["stages"] = stages
        return JSONResponse(body)

    @app.get("/ready")
    async def ready() -> Response:
        if host.is_dead:
            return error_response(engine_dead(host.death_reason()))
        if not host.is_ready:
            return error_response(not_ready())
        # The engine loop's heartbeat: a wedged loop shows as a growing age while "idle".
        return JSONResponse({"status": "ready", "model": served_model_name, "loop": host.loop_status()})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(served_model_name, created, makes, host.engine)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id not in names:
            raise APIError(404, f"model {model_id!r} is not served here", param="model", code="model_not_found")
        return _model_card(served_model_name, created, makes, host.engine)

    @app.get("/v1/config")
    async def resolved_config() -> dict[str, Any]:
        cfg = config if config is not None else host.engine.config if host.engine is not None else None
        if cfg is None:
            raise not_ready()
        view = config_view(cfg, expose=server.expose_config)
        if host.engine is not None:  # what the loaded weights take, per component (docs/quantization.md)
            view["weights"] = {name: w.as_dict() for name, w in host.engine.weights.items()}
        return view

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    # Added last = runs first: metrics see every response; then Host, the key (so an unknown path
    # without the key is 401, not 404), the route table (404/405), and only then is a body read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=server.max_body_bytes, timeout_s=server.body_timeout_s,
                       uploads={EDITS_PATH: server.max_upload_bytes, VIDEOS_PATH: server.max_upload_bytes},
                       json_uploads=frozenset({VIDEOS_PATH}))
    app.add_middleware(RouteGuardMiddleware, routes=app.router.routes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    app.add_middleware(PlaygroundMiddleware)  # GET / and its files: before the key (the page asks for it)
    if server.allowed_hosts:
        app.add_middleware(HostMiddleware, allowed=server.allowed_hosts)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def _model_card(name: str, created: int, makes: str, engine: AsyncEngineClient | None) -> dict[str, Any]:
    # ``diffserve.makes``: what the model's requests produce, and so which API serves it (the playground's tabs);
    # ``diffserve.defaults``: what a request that names nothing gets, once the model is loaded (its form's values).
    info: dict[str, Any] = {"makes": makes}
    defaults = request_defaults(engine) if engine is not None and engine.is_ready else None
    if defaults is not None:
        info["defaults"] = defaults
    return {"id": name, "object": "model", "created": created, "owned_by": "diffserve", "diffserve": info}


def request_defaults(engine: AsyncEngineClient) -> dict[str, Any] | None:
    """The size, steps, guidance (and a video's frames and fps) admission gives a request that sets none: the
    model's own defaults unless the deployment set others. None if the engine cannot say (it refuses such a
    request, e.g. a default size above ``server.max_pixels``)."""
    from diffserve.types.request import GenerationRequest

    capabilities = engine.capabilities
    try:
        filled = engine.admit(GenerationRequest(prompt="defaults", seed=0))
    except Exception:  # noqa: BLE001 - no defaults to show; requests still get the engine's own answer
        return None
    size = capabilities.default_size if capabilities is not None else None
    width, height = filled.width or size, filled.height or size
    defaults: dict[str, Any] = {"size": f"{width}x{height}" if width and height else None,
                                "num_inference_steps": filled.num_inference_steps,
                                "guidance_scale": filled.guidance_scale}
    if filled.num_frames is not None:
        defaults.update(num_frames=filled.num_frames, fps=filled.fps)
    return defaults
