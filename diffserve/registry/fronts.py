"""Serving fronts by name: what ``diffserve serve`` hands its models to instead of
running its own uvicorn.

A front sits above ``entrypoints`` (its replicas build the entrypoints' app), so the
``serve`` command must not import it: that would be a package cycle
(``tests/test_layering.py``). The command names the front here and imports it only when
chosen (``load_target``). Each target is a function called as ``run(models, *, api_key,
image_ttl_s, host, port)`` that serves until stopped and returns the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrontSpec:
    name: str
    target: str  # "module:function" that runs the front
    doc: str


FRONTS: dict[str, FrontSpec] = {
    spec.name: spec
    for spec in (
        FrontSpec(
            "ray_serve",
            "diffserve.ray_serve.runner:run_ray_serve",
            "serve --ray-serve: Ray Serve's HTTP proxy before replicas "
            "that are each a whole engine",
        ),
    )
}
