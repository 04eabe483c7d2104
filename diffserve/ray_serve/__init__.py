"""The Ray Serve front: the OpenAI-compatible API of ``diffserve serve`` from a Ray
Serve deployment whose replicas are diffserve engines, scaled by ``server.autoscaling``
(docs/deploy.md, "Ray Serve").

* ``diffserve serve --ray-serve ...``: starts (or joins) Ray, runs the application,
  stops it on SIGINT/SIGTERM.
* ``serve run diffserve.ray_serve:app model=/models/flux enforce_eager=true
  autoscaling_max_replicas=4``, or in
  Python ``serve.run(diffserve.ray_serve.app({"model": "/models/flux"}))``.

Importing this package imports neither Ray nor torch; ``app`` does (Ray Serve, when
called).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ray.serve import Application

__all__ = ["app"]


def app(args: Mapping[str, Any] | None = None) -> Application:
    """The Serve application: ``args`` are ``diffserve serve``'s arguments (``model``: a
    path or hub id, several comma-separated or a list; ``deploy_config``,
    ``served_model_name``, ``api_key_file``, ``image_url_ttl``, ``stage_overrides``,
    ``platform``; ``ray_actor_options`` to replace what a replica asks Ray for) and any
    config key by flat name or YAML key (``enforce_eager``,
    ``autoscaling_max_replicas``, ``server``). One parameter, as Ray Serve's application
    builders take."""
    from diffserve.ray_serve.builder import application_from_args

    return application_from_args(args)
