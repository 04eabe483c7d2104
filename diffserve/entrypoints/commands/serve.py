"""``diffserve serve [MODEL ...]``: the OpenAI-compatible HTTP server.

MODEL is a diffusers directory or a hub id (``org/name[@revision]``, config/hub.py);
several are served each by its own engine (``config/model_list.py``; a deploy file's
``models:`` list likewise). Without MODEL: the deploy file's ``model:``, else the
shipped toy-shapes demo model. Config flags are the shared ones from
``diffserve.config.cli_args``; they apply to every model.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from diffserve.logging import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.entrypoints.openai.served import ModelServing

logger = get_logger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    from diffserve.config.cli_args import add_config_arguments

    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model directory (or, without MODEL, the toy-shapes "
        "demo model) "
        "over an OpenAI-compatible HTTP API: POST /v1/images/generations, "
        "GET /v1/models, "
        "/health, /ready, /metrics, /v1/config.",
    )
    parser.add_argument(
        "model",
        nargs="*",
        default=[],
        metavar="MODEL",
        help="model directory (diffusers layout) or hub id org/name[@revision] "
        "from the Hugging "
        "Face cache; several: each served by its own engine, "
        "the first the default of requests "
        "that name none; default: the deploy file's model: (or models: list), else the "
        "built-in toy-shapes model",
    )
    add_config_arguments(parser)
    server = parser.add_argument_group("server")
    server.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    server.add_argument(
        "--port", type=int, default=8000, help="port to bind (default 8000)"
    )
    server.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every path "
        "except /health, /ready and "
        "/metrics (visible in the process list: prefer --api-key-file or "
        "DIFFSERVE_API_KEY; exactly one of the three)",
    )
    server.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="read the API key from PATH (surrounding whitespace stripped)",
    )
    server.add_argument(
        "--served-model-name",
        default=None,
        help="the model id clients send and /v1/models lists "
        "(default: the model directory's name)",
    )
    # The same setting as --default-num-inference-steps
    # (request_defaults.num_inference_steps, source cli).
    server.add_argument(
        "--default-steps",
        dest="config_default_num_inference_steps",
        default=None,
        metavar="N",
        help="num_inference_steps of requests that send none: short for "
        "--default-num-inference-steps (default: the model's)",
    )
    server.add_argument(
        "--lora",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="register a LoRA adapter requests can name (repeatable; "
        "joins lora_modules)",
    )
    server.add_argument(
        "--image-url-ttl",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long images returned with response_format=url stay downloadable",
    )
    server.add_argument(
        "--ray-serve",
        action="store_true",
        help="serve through Ray Serve: its HTTP proxy listens on "
        "--host/--port and each replica is "
        "a whole engine, scaled between server.autoscaling.min_replicas "
        "and max_replicas "
        "(the ray extra; Ray local on 127.0.0.1, or ray_address's "
        "cluster; docs/deploy.md)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Heavy imports here, never at module import: `diffserve --help` must stay fast.
    from diffserve.config.cli_args import config_kwargs_from_args
    from diffserve.entrypoints.api_key import resolve_api_key
    from diffserve.entrypoints.provenance_keys import signer_for
    from diffserve.entrypoints.served_models import serving_models

    # Before the model is built: a key given twice (or an unreadable key file) fails at
    # once.
    api_key = resolve_api_key(args.api_key, args.api_key_file, os.environ)
    kwargs = config_kwargs_from_args(args)
    # --lora a=x --lora b=y: more entries of lora_modules (a flag's value joins a
    # file's)
    if args.lora:
        overrides = kwargs.setdefault("overrides", {}) or {}
        overrides["lora_modules"] = ",".join(
            filter(None, [overrides.get("lora_modules", ""), *args.lora])
        )
        kwargs["overrides"] = overrides
    models = serving_models(args.model, kwargs, args.served_model_name)
    config = models[0].config
    assert config is not None
    # The signing key before any model loads: a bad key_file fails at once (it is read
    # once per process, then shared by the images API and the video job runner).
    signer_for(config.server)
    if args.ray_serve:
        return _run_front("ray_serve", models, api_key, args)
    _warn_unused_autoscaling(config)
    return _run_uvicorn(models, config, api_key, args)


def _run_front(
    name: str, models: list[ModelServing], api_key: str | None, args: argparse.Namespace
) -> int:
    """A front above this package (Ray Serve), reached by its registry name: importing
    it here would be a package cycle, since its replicas build this package's app."""
    from diffserve.registry.fronts import FRONTS
    from diffserve.registry.targets import load_target

    run_front: Callable[..., int] = load_target(FRONTS[name].target)
    return run_front(
        models,
        api_key=api_key,
        image_ttl_s=args.image_url_ttl,
        host=args.host,
        port=args.port,
    )


def _run_uvicorn(
    models: list[ModelServing],
    config: ResolvedConfig,
    api_key: str | None,
    args: argparse.Namespace,
) -> int:
    """One process, one engine per model, behind uvicorn."""
    import uvicorn

    from diffserve.entrypoints.openai.app import create_app

    app = create_app(
        models=models,
        api_key=api_key,
        image_ttl_s=args.image_url_ttl,
        instance_name=f"{socket.gethostname()}:{args.port}",
    )
    logger.info(
        "serving %s at http://%s:%d (GET /ready turns 200 once every model is warmed)",
        ", ".join(repr(m.name) for m in models),
        args.host,
        args.port,
    )
    # limit_concurrency: connections beyond server.max_connections get uvicorn's plain
    # 503 and are closed. An idle keep-alive connection is dropped after 5 s, and
    # headers larger than 16 KiB are refused, so neither idle nor header-stuffing
    # clients pile up; body_timeout_s bounds the body.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
        limit_concurrency=config.server.max_connections,
        timeout_keep_alive=5,
        http="h11",
        h11_max_incomplete_event_size=16 * 1024,
    )
    return 0


def _warn_unused_autoscaling(config: ResolvedConfig) -> None:
    """``server.autoscaling`` set, but no Ray Serve: a warning, not an error, because
    one deploy file may serve both ways (``serve run`` in production, a plain
    ``diffserve serve`` on a laptop)."""
    written = [
        key
        for key in config.provenance
        if key.startswith("server.autoscaling.") and config.is_explicit(key)
    ]
    if written:
        logger.warning(
            "%s set (%s) but the server runs without --ray-serve: "
            "one process with one engine per "
            "model, no autoscaling; add --ray-serve (or use num_replicas "
            "for more copies in this "
            "process)",
            ", ".join(written),
            config.source_of(written[0]).describe(),
        )
