"""Step-cache backends by name: what each compares, its default threshold and where that
number comes from.

``config`` derives the allowed ``cache.backend`` values and the backend-dependent
default of ``cache.threshold`` from this table; the runtime (``models/stepcache``)
implements each signal. For every backend a HIGHER threshold means MORE skipping: a step
is skipped while its signal stays below it.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffserve.registry.targets import spelling_table


@dataclass(frozen=True)
class CacheBackendSpec:
    name: str
    doc: str  # what the signal compares
    default_threshold: float
    provenance: str  # where the default threshold was published


CACHE_BACKENDS: dict[str, CacheBackendSpec] = {
    spec.name: spec
    for spec in (
        CacheBackendSpec(
            "none", "no step cache: every step runs the whole transformer", 0.0, ""
        ),
        CacheBackendSpec(
            "fbcache",
            "First-Block Cache: relative mean absolute difference "
            "of block 0's image residual from the "
            "last computed step; below the threshold the other "
            "blocks' cached residual is reused",
            0.08,
            "ParaAttention doc/fastest_flux.md "
            "(FLUX.1-dev, residual_diff_threshold=0.08)",
        ),
        CacheBackendSpec(
            "teacache",
            "TeaCache: relative L1 change of block 0's timestep-modulated "
            "input, rescaled by the FLUX "
            "polynomial and accumulated over skipped steps; below "
            "the threshold the residual of all "
            "blocks is reused",
            0.6,
            "ali-vilab/TeaCache TeaCache4FLUX/teacache_flux.py "
            "(rel_l1_thresh = 0.6, its '2.0x' setting; "
            "0.25/0.4/0.8 are listed for 1.5x/1.8x/2.25x)",
        ),
    )
}
CACHE_ALIASES: dict[str, str] = {
    "off": "none",
    "first_block_cache": "fbcache",
    "fbc": "fbcache",
    "tea_cache": "teacache",
}


def cache_spellings() -> dict[str, str]:
    return spelling_table(list(CACHE_BACKENDS), CACHE_ALIASES)
