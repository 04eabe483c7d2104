"""``diffserve serve [MODEL ...]``: the OpenAI-compatible HTTP server.

MODEL is a diffusers directory or a hub id (``org/name[@revision]``, config/hub.py); several are served each by
its own engine (``config/model_list.py``; a deploy file's ``models:`` list likewise). Without MODEL: the deploy
file's ``model:``, else the shipped toy-shapes demo model. Config flags are the shared ones from
``diffserve.config.cli_args``; they apply to every model.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffserve.logging import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.model_list import ModelEntry
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.engine.client import AsyncEngineClient
    from diffserve.entrypoints.openai.served import ModelServing

logger = get_logger(__name__)

def register(subparsers: argparse._SubParsersAction) -> None:
    from diffserve.config.cli_args import add_config_arguments

    parser = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a FLUX model directory (or, without MODEL, the toy-shapes demo model) "
                    "over an OpenAI-compatible HTTP API: POST /v1/images/generations, GET /v1/models, "
                    "/health, /ready, /metrics, /v1/config.")
    parser.add_argument("model", nargs="*", default=[], metavar="MODEL",
                        help="model directory (diffusers layout) or hub id org/name[@revision] from the Hugging "
                             "Face cache; several: each served by its own engine, the first the default of requests "
                             "that name none; default: the deploy file's model: (or models: list), else the "
                             "built-in toy-shapes model")
    add_config_arguments(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    server.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on every path except /health, /ready and "
                             "/metrics (visible in the process list: prefer --api-key-file or "
                             "DIFFSERVE_API_KEY; exactly one of the three)")
    server.add_argument("--api-key-file", default=None, metavar="PATH",
                        help="read the API key from PATH (surrounding whitespace stripped)")
    server.add_argument("--served-model-name", default=None,
                        help="the model id clients send and /v1/models lists "
                             "(default: the model directory's name, or tiny-flux for the demo)")
    # The same setting as --default-num-inference-steps (request_defaults.num_inference_steps, source cli).
    server.add_argument("--default-steps", dest="config_default_num_inference_steps", default=None, metavar="N",
                        help="num_inference_steps of requests that send none: short for "
                             "--default-num-inference-steps (default: the model's)")
    server.add_argument("--lora", action="append", default=None, metavar="NAME=PATH",
                        help="register a LoRA adapter requests can name (repeatable; joins lora_modules)")
    server.add_argument("--image-url-ttl", type=float, default=600.0, metavar="SECONDS",
                        help="how long images returned with response_format=url stay downloadable")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Heavy imports here, never at module import: `diffserve --help` must stay fast.
    import uvicorn

    from diffserve.config.cli_args import config_kwargs_from_args
    from diffserve.config.model_list import model_entries
    from diffserve.entrypoints.api_key import resolve_api_key
    from diffserve.entrypoints.openai.app import create_app
    from diffserve.errors import ConfigError

    # Before the model is built: a key given twice (or an unreadable key file) fails at once.
    api_key = resolve_api_key(args.api_key, args.api_key_file, os.environ)
    kwargs = config_kwargs_from_args(args)
    if args.lora:  # --lora a=x --lora b=y: more entries of lora_modules (a flag's value joins a file's)
        overrides = kwargs.setdefault("overrides", {}) or {}
        overrides["lora_modules"] = ",".join(filter(None, [overrides.get("lora_modules", ""), *args.lora]))
        kwargs["overrides"] = overrides
    entries = model_entries(args.model, kwargs.pop("deploy_config", None))
    if args.served_model_name is not None and len(entries) > 1:
        raise ConfigError(f"--served-model-name names one model, and {len(entries)} are served",
                          path="--served-model-name", hint="name each in a deploy file's models: entry (name:)")
    models = [_serving(entry, kwargs, args.served_model_name) for entry in entries]
    _check_distinct(models)
    config = models[0].config
    assert config is not None
    app = create_app(models=models, api_key=api_key, image_ttl_s=args.image_url_ttl,
                     instance_name=f"{socket.gethostname()}:{args.port}")
    logger.info("serving %s at http://%s:%d (GET /ready turns 200 once every model is warmed)",
                ", ".join(repr(m.name) for m in models), args.host, args.port)
    # limit_concurrency: connections beyond server.max_connections get uvicorn's plain 503 and are
    # closed. An idle keep-alive connection is dropped after 5 s, and headers larger than 16 KiB are
    # refused, so neither idle nor header-stuffing clients pile up; body_timeout_s bounds the body.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=10, limit_concurrency=config.server.max_connections,
                timeout_keep_alive=5, http="h11", h11_max_incomplete_event_size=16 * 1024)
    return 0


def _serving(entry: ModelEntry, kwargs: dict[str, Any], served_model_name: str | None) -> ModelServing:
    """One model's resolved config, the engine factory built from it and its names."""
    from diffserve.config.resolve import resolve
    from diffserve.entrypoints.openai.served import ModelServing

    config = resolve(model=entry.model, deploy_config=entry.deploy_config, **kwargs)
    if config.model is None:  # neither MODEL nor the deploy file's model:
        config = resolve(model=_demo_model(), deploy_config=entry.deploy_config, **kwargs)
    name, aliases = _names(config, entry.name or served_model_name)
    for warning in config.warnings:
        logger.warning("config of %s: %s", name, warning)
    logger.info("config fingerprint of %s: %s", name, config.fingerprint)

    def build_engine() -> AsyncEngineClient:
        from diffserve.engine.async_engine import AsyncEngine

        return AsyncEngine.from_config(config)

    return ModelServing(name, factory=build_engine, config=config, aliases=aliases)


def _check_distinct(models: list[ModelServing]) -> None:
    from diffserve.entrypoints.openai.served import first_shared_name
    from diffserve.errors import ConfigError

    shared = first_shared_name([{model.name, *model.aliases} for model in models])
    if shared is not None:
        raise ConfigError(f"two models answer to {shared!r}", path="models",
                          hint="give each a name: serve them from a deploy file's models: list with name: per entry")


def _demo_model() -> str:
    from diffserve.zoo.flux import ensure_demo_model

    path = ensure_demo_model()
    logger.warning("no MODEL given: serving the built-in toy-shapes demo model from %s, a tiny FLUX trained "
                   "to draw 'a {colour} {shape} on a {colour} background' (64x64).", path)
    return str(path)


def _names(config: ResolvedConfig, served_model_name: str | None) -> tuple[str, tuple[str, ...]]:
    """The id clients use for the model, and the other ids accepted for it: a hub model's is its repository
    id (its short name and the id as given also work), a folder's its name (the demo's: toy-shapes)."""
    source = config.model_source
    assert source is not None and config.model is not None
    if source.repo_id:
        aliases = (source.given, source.repo_id, source.repo_id.rsplit("/", 1)[1])
        return served_model_name or source.repo_id, aliases
    name = Path(source.given).name
    return served_model_name or name, (source.given, name)
