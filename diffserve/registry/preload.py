"""What the mp fork server imports once before it forks workers (``executor/mp.py``):
every family's pipeline module and the library modules its load imports (diffusers and
transformers import their model code lazily, on first attribute access)."""

from __future__ import annotations

from diffserve.registry.family import GENERIC_PIPELINE
from diffserve.registry.models import FLUX_PIPELINE, MODEL_FAMILIES
from diffserve.registry.video_families import WAN_PIPELINE

# The library modules each pipeline's load imports (diffusers and transformers import
# their model code lazily, on first attribute access): the mp fork server imports them
# once before it forks workers (executor/mp.py).
PIPELINE_LIBRARIES: dict[str, tuple[str, ...]] = {
    FLUX_PIPELINE: (
        "transformers.models.clip.modeling_clip",
        "transformers.models.t5.modeling_t5",
    ),
    GENERIC_PIPELINE: ("diffusers.models.autoencoders",),
    WAN_PIPELINE: ("transformers.models.umt5.modeling_umt5",),
}


def worker_preload_modules() -> list[str]:
    """Every family's pipeline module and the library modules its load imports, each
    once, in family order."""
    modules: dict[str, None] = {}
    for family in MODEL_FAMILIES.values():
        modules.update(dict.fromkeys(PIPELINE_LIBRARIES.get(family.pipeline, ())))
        modules[family.pipeline.split(":", 1)[0]] = None
    return list(modules)
