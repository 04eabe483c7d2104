"""The routes about the served models: liveness and readiness (``/health``, ``/ready``),
the model list (``/v1/models``) and each model's resolved config (``/v1/config``). A
server of several models answers for each (``/health`` and ``/ready`` name every model;
``?model=`` picks one config)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from diffserve.engine.client import AsyncEngineClient
from diffserve.entrypoints.api_errors import APIError, engine_dead, not_ready
from diffserve.entrypoints.openai.config_view import config_view
from diffserve.entrypoints.openai.served import ServedModel, ServedModels
from diffserve.registry.example_prompts import model_example_prompts


def add_model_routes(
    app: FastAPI, models: ServedModels, created: int, *, expose_config: bool
) -> None:
    def error(exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.get("/health")
    async def health() -> Response:
        # Liveness: the process answers; a dead engine fails it so orchestrators restart
        # the server. Replicas taken out leave it 200 ("degraded"): the others still
        # serve, a restart would stop them.
        states = {model.name: model_health(model) for model in models}
        dead = next(
            (name for name, (problem, _) in states.items() if problem is not None), None
        )
        if dead is not None:
            problem = states[dead][0]
            assert problem is not None
            return error(
                engine_dead(
                    problem if len(models) == 1 else f"model {dead!r}: {problem}"
                )
            )
        if len(models) == 1:
            return JSONResponse(states[models.first.name][1])
        bodies = {name: body for name, (_, body) in states.items()}
        degraded = any(body["status"] != "ok" for body in bodies.values())
        return JSONResponse(
            {"status": "degraded" if degraded else "ok", "models": bodies}
        )

    @app.get("/ready")
    async def ready() -> Response:
        for model in models:
            if model.host.is_dead:
                reason = model.host.death_reason()
                return error(
                    engine_dead(
                        reason
                        if len(models) == 1
                        else f"model {model.name!r}: {reason}"
                    )
                )
        loading = [model.name for model in models if not model.host.is_ready]
        if loading:
            return error(
                not_ready()
                if len(models) == 1
                else APIError(
                    503,
                    f"still loading: {', '.join(loading)}; poll GET /ready",
                    code="not_ready",
                )
            )
        # The engine loop's heartbeat: a wedged loop shows as a growing age while
        # "idle".
        body: dict[str, Any] = {
            "status": "ready",
            "model": models.first.name,
            "loop": models.first.host.loop_status(),
        }
        if len(models) > 1:
            body["models"] = {
                model.name: {"loop": model.host.loop_status()} for model in models
            }
        return JSONResponse(body)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [model_card(model, created) for model in models],
        }

    @app.get("/v1/models/{model_id:path}")
    async def one_model(model_id: str) -> dict[str, Any]:
        served = models.find(model_id)
        if served is None:
            raise APIError(
                404,
                f"model {model_id!r} is not served here",
                param="model",
                code="model_not_found",
            )
        return model_card(served, created)

    @app.get("/v1/config")
    async def resolved_config(request: Request) -> dict[str, Any]:
        served = models.pick(request.query_params.get("model"))
        engine = served.host.engine
        cfg = (
            served.config
            if served.config is not None
            else engine.config
            if engine is not None
            else None
        )
        if cfg is None:
            raise not_ready()
        view = config_view(cfg, expose=expose_config)
        # What the loaded weights take, per component (docs/quantization.md)
        if engine is not None:
            view["weights"] = {name: w.as_dict() for name, w in engine.weights.items()}
        return view


def model_health(model: ServedModel) -> tuple[str | None, dict[str, Any]]:
    """(why the model cannot serve, or None; its /health body)."""
    host = model.host
    if host.is_dead:
        return host.death_reason(), {}
    replicas = host.replicas()
    if replicas is None:
        return None, {"status": "ok"}
    live, configured = replicas
    stages = host.stages() or []
    empty = next((s for s in stages if s["replicas_live"] == 0), None)
    if live == 0 or empty is not None:
        where = (
            f"stage {empty['stage_id']} ({empty['role']})"
            if empty is not None
            else "the engine"
        )
        return f"no replica of {where} is live", {}
    degraded = live < configured or any(
        s["replicas_live"] < s["replicas"] for s in stages
    )
    body: dict[str, Any] = {
        "status": "degraded" if degraded else "ok",
        "replicas_live": live,
        "replicas": configured,
    }
    if len(stages) > 1:  # a staged topology: each stage's replicas
        body["stages"] = stages
    return None, body


def model_card(model: ServedModel, created: int) -> dict[str, Any]:
    # ``diffserve.makes``: what the model's requests produce, and so which API serves it
    # (the playground's tabs); ``diffserve.defaults``: what a request that names nothing
    # gets, once the model is loaded (its form's values); ``diffserve.example_prompts``:
    # prompts the model knows, from its marker file (the playground's first prompt),
    # known before it loads.
    engine = model.host.engine
    examples = model_example_prompts(getattr(model.config, "model", None))
    info: dict[str, Any] = {"makes": model.makes, "example_prompts": list(examples)}
    defaults = (
        request_defaults(engine) if engine is not None and model.host.is_ready else None
    )
    if defaults is not None:
        info["defaults"] = defaults
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "diffserve",
        "diffserve": info,
    }


def request_defaults(engine: AsyncEngineClient) -> dict[str, Any] | None:
    """The size, steps, guidance (and a video's frames and fps) admission gives a
    request that sets none: the model's own defaults unless the deployment set others.
    None if the engine cannot say (it refuses such a request, e.g. a default size above
    ``server.max_pixels``)."""
    from diffserve.types.request import GenerationRequest

    try:
        filled = engine.admit(GenerationRequest(prompt="defaults", seed=0))
    except Exception:  # noqa: BLE001 - no defaults to show; requests still get the engine's own answer
        return None
    # Admission filled the model's size (types/modality.py)
    width, height = (filled.width, filled.height)
    defaults: dict[str, Any] = {
        "size": f"{width}x{height}" if width and height else None,
        "num_inference_steps": filled.num_inference_steps,
        "guidance_scale": filled.guidance_scale,
    }
    if filled.num_frames is not None:
        defaults.update(num_frames=filled.num_frames, fps=filled.fps)
    return defaults
