"""The support matrix: what each registered family serves, derived from its registry
entry alone, so that docs/models.md's table (which a test compares with this) cannot
drift from what the code does."""

from __future__ import annotations

from diffserve.registry.models import MODEL_FAMILIES, ModelFamily
from diffserve.registry.quantization import QUANTIZATION_METHODS

COLUMNS = (
    "family",
    "path",
    "generations",
    "edits",
    "LoRA",
    "step cache",
    "parallel",
    "quantization",
    "single files",
)


def family_support(family: ModelFamily) -> tuple[str, ...]:
    """One row of the matrix, in ``COLUMNS`` order."""
    generic = family.implementation == "generic"
    caches = (
        ("fbcache",)
        if generic and family.generic.first_block_cache
        else ()
        if generic
        else family.features.step_caches
    )
    parallel = " x ".join(
        {"cfg_parallel_size": "CFG", "ulysses_degree": "Ulysses"}[d]
        for d in family.parallel.dims
    )
    methods = ", ".join(name for name in QUANTIZATION_METHODS if name != "none")
    return (
        f"`{family.class_name}`",
        family.implementation,
        f"{family.defaults.modality}s"
        + (
            f" ({', '.join(family.features.output_extras)})"
            if family.features.output_extras
            else ""
        ),
        ", ".join(family.features.edits) or "-",
        "per request" if family.features.lora_check else "-",
        ", ".join(caches) or "-",
        parallel or "-",
        methods,
        ", ".join(family.features.single_file_components) or "-",
    )


def support_matrix() -> list[tuple[str, ...]]:
    """Every family's row, in registry order."""
    return [family_support(family) for family in MODEL_FAMILIES.values()]


def support_table() -> str:
    """The matrix as the Markdown table docs/models.md shows."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in support_matrix()]
    return "\n".join(lines) + "\n"
