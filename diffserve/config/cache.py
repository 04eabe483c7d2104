"""The step cache's backend-dependent rules, applied to one stage's picked values before
it is built.

``cache.threshold`` left unset takes the chosen backend's published default
(``registry/caches.py``; TeaCache's is the one published with its polynomial,
``registry/teacache.py``), recorded as a ``default`` with the reason, so it never poses
as an explicit choice. A threshold on a stage without a cache backend, or above the
stage's ``cache.max_threshold``, is a ConfigError.
"""

from __future__ import annotations

from typing import Any

from diffserve.config.provenance import Collector, Source
from diffserve.registry.caches import CACHE_BACKENDS
from diffserve.registry.teacache import TEACACHE_POLYNOMIALS


def settle_cache(
    stage_id: int, values: dict[str, Any], sources: dict[str, Source], out: Collector
) -> None:
    """Fill ``cache.threshold`` from the backend and check it against the backend and
    the bound."""
    backend = values["cache.backend"]
    threshold = values["cache.threshold"]
    path = f"stages.{stage_id}.cache.threshold"
    if backend == "none":
        if threshold is not None and threshold > 0:
            out.error(
                f"cache.threshold={threshold} is set but cache.backend is none",
                path=path,
                source=sources["cache.threshold"],
                hint="choose cache.backend: fbcache or teacache, or remove "
                "cache.threshold",
            )
        values["cache.threshold"] = 0.0
        sources["cache.threshold"] = Source(
            "default", detail="cache.backend none: no step cache"
        )
        return
    polynomial = (
        TEACACHE_POLYNOMIALS.get(values["cache.teacache_coefficients"])
        if backend == "teacache"
        else None
    )
    # TeaCache's thresholds are per fitted polynomial.
    if threshold is None and polynomial is not None:
        values["cache.threshold"] = threshold = polynomial.default_threshold
        sources["cache.threshold"] = Source(
            "default",
            detail=f"teacache default for {polynomial.name}, from "
            f"{polynomial.provenance}",
        )
    elif threshold is None:
        spec = CACHE_BACKENDS[backend]
        values["cache.threshold"] = threshold = spec.default_threshold
        sources["cache.threshold"] = Source(
            "default", detail=f"{backend} default, from {spec.provenance}"
        )
    bound = values["cache.max_threshold"]
    if threshold > bound:
        out.error(
            f"cache.threshold={threshold} is above cache.max_threshold={bound}",
            path=path,
            source=sources["cache.threshold"],
            hint=f"lower cache.threshold to at most {bound}, or raise "
            "cache.max_threshold",
        )
