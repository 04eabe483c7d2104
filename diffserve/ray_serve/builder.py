"""``diffserve.ray_serve.app``'s arguments -> the Serve application (what ``serve run
diffserve.ray_serve:app key=value ...`` and a Python caller hand it).

The keys ``diffserve serve`` takes as arguments are read here; every other key is a
config setting, by its flat name or YAML key (``enforce_eager=true``,
``autoscaling_max_replicas=4``, ``server={...}``), resolved like a command-line flag
(source ``cli``). Values may be text, as ``serve run`` gives them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from diffserve.entrypoints.api_key import resolve_api_key
from diffserve.entrypoints.served_models import serving_models
from diffserve.errors import ConfigError
from diffserve.ray_serve.spec import ReplicaSpec, replica_spec

if TYPE_CHECKING:  # pragma: no cover
    from ray.serve import Application

# The arguments of `diffserve serve` (not config keys), as keys of the builder's dict.
SERVER_ARGS = (
    "model",
    "deploy_config",
    "served_model_name",
    "api_key",
    "api_key_file",
    "image_url_ttl",
    "ray_actor_options",
    "stage_overrides",
    "platform",
)


def application_from_args(args: Mapping[str, Any] | None) -> Application:
    from diffserve.ray_serve.deployment import build_application

    spec, actor_options = spec_from_args(args)
    return build_application(spec, actor_options)


def spec_from_args(
    args: Mapping[str, Any] | None,
) -> tuple[ReplicaSpec, dict[str, Any] | None]:
    """The replicas' spec (models resolved here, once) and the ``ray_actor_options``
    given, if any."""
    values = dict(args or {})
    given = {key: values.pop(key) for key in SERVER_ARGS if key in values}
    api_key = resolve_api_key(
        given.get("api_key"), given.get("api_key_file"), os.environ
    )
    kwargs = {
        "deploy_config": given.get("deploy_config"),
        "platform": given.get("platform"),
        "stage_overrides": _mapping(given.get("stage_overrides"), "stage_overrides"),
        "overrides": values,
    }
    models = serving_models(
        model_list(given.get("model")), kwargs, given.get("served_model_name")
    )
    spec = replica_spec(
        models, api_key=api_key, image_ttl_s=float(given.get("image_url_ttl", 600.0))
    )
    return spec, _mapping(given.get("ray_actor_options"), "ray_actor_options")


def model_list(value: Any) -> list[str]:
    """``model``: one model, several as a list or comma-separated (``serve run`` passes
    text), or none."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    if isinstance(value, (list, tuple)) and all(
        isinstance(item, str) for item in value
    ):
        return list(value)
    raise ConfigError(
        "model must be a path or hub id, or a list of them; "
        f"got {type(value).__name__}",
        path="model",
        hint="model=/models/flux or model=org/a,org/b",
    )


def _mapping(value: Any, key: str) -> dict[str, Any] | None:
    """A mapping argument given as a dict, or as JSON text (``serve run
    key='{...}'``)."""
    if value is None or isinstance(value, Mapping):
        return dict(value) if value is not None else None
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{key} is not valid JSON: {exc}", path=key, hint=f"{key}='{{...}}'"
        ) from None
    if not isinstance(parsed, dict):
        raise ConfigError(
            f"{key} must be a mapping (a dict, or JSON text of an object)",
            path=key,
            hint=f"{key}='{{...}}'",
        )
    return parsed
