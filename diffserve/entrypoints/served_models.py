"""The models one server serves, from the command line or a builder's arguments: each
model's resolved config, the engine factory built from it and the names clients use for
it.

Shared by ``diffserve serve`` (one process) and the Ray Serve front
(``diffserve.ray_serve``: resolved once by the driver, each replica building its own
engines from the same configs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffserve.logging import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.model_list import ModelEntry
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.engine.client import AsyncEngineClient
    from diffserve.entrypoints.openai.served import ModelServing

logger = get_logger(__name__)


def serving_models(
    model_args: Sequence[str],
    config_kwargs: dict[str, Any],
    served_model_name: str | None,
) -> list[ModelServing]:
    """``MODEL ...`` (or the deploy file's ``model:``/``models:``, else the demo model)
    resolved with the shared config keywords (``resolve(**config_kwargs)``, its
    ``deploy_config`` included): one ``ModelServing`` each, names checked distinct.
    Raises ``ConfigError``."""
    from diffserve.config.model_list import model_entries
    from diffserve.errors import ConfigError

    kwargs = dict(config_kwargs)
    entries = model_entries(list(model_args), kwargs.pop("deploy_config", None))
    if served_model_name is not None and len(entries) > 1:
        raise ConfigError(
            f"--served-model-name names one model, and {len(entries)} are served",
            path="--served-model-name",
            hint="name each in a deploy file's models: entry (name:)",
        )
    models = [_serving(entry, kwargs, served_model_name) for entry in entries]
    _check_distinct(models)
    return models


def model_serving(
    name: str, config: ResolvedConfig, aliases: tuple[str, ...] = ()
) -> ModelServing:
    """A model to serve from its resolved config: the engine is built from it after the
    server starts."""
    from diffserve.entrypoints.openai.served import ModelServing

    def build_engine() -> AsyncEngineClient:
        from diffserve.engine.async_engine import AsyncEngine

        return AsyncEngine.from_config(config)

    return ModelServing(name, factory=build_engine, config=config, aliases=aliases)


def _serving(
    entry: ModelEntry, kwargs: dict[str, Any], served_model_name: str | None
) -> ModelServing:
    """One model's resolved config, the engine factory built from it and its names."""
    from diffserve.config.resolve import resolve

    config = resolve(model=entry.model, deploy_config=entry.deploy_config, **kwargs)
    if config.model is None:  # neither MODEL nor the deploy file's model:
        config = resolve(
            model=_demo_model(), deploy_config=entry.deploy_config, **kwargs
        )
    name, aliases = _names(config, entry.name or served_model_name)
    for warning in config.warnings:
        logger.warning("config of %s: %s", name, warning)
    logger.info("config fingerprint of %s: %s", name, config.fingerprint)
    return model_serving(name, config, aliases)


def _check_distinct(models: list[ModelServing]) -> None:
    from diffserve.entrypoints.openai.served import first_shared_name
    from diffserve.errors import ConfigError

    shared = first_shared_name([{model.name, *model.aliases} for model in models])
    if shared is not None:
        raise ConfigError(
            f"two models answer to {shared!r}",
            path="models",
            hint="give each a name: serve them from a deploy file's "
            "models: list with name: per entry",
        )


def _demo_model() -> str:
    from diffserve.zoo.demo import ensure_demo_model

    path = ensure_demo_model()
    logger.warning(
        "no MODEL given: serving the built-in toy-shapes demo "
        "model from %s, a tiny model trained "
        "to draw 'a {colour} {shape} on a {colour} background' (64x64).",
        path,
    )
    return str(path)


def _names(
    config: ResolvedConfig, served_model_name: str | None
) -> tuple[str, tuple[str, ...]]:
    """The id clients use for the model, and the other ids accepted for it: a hub
    model's is its repository id (its short name and the id as given also work), a
    folder's its name (the demo's: toy-shapes)."""
    source = config.model_source
    assert source is not None and config.model is not None
    if source.repo_id:
        aliases = (source.given, source.repo_id, source.repo_id.rsplit("/", 1)[1])
        return served_model_name or source.repo_id, aliases
    name = Path(source.given).name
    return served_model_name or name, (source.given, name)
