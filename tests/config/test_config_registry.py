"""Config and the registries cannot drift: every allowed value and model default comes
from one table."""

from __future__ import annotations

import dataclasses

from diffserve.config import canonical as c
from diffserve.config import structured as sv
from diffserve.config.schema import StageConfig
from diffserve.config.stage_sections import ATTENTION_ROLES
from diffserve.registry.backends import ATTENTION_BACKENDS, LINEAR_BACKENDS
from diffserve.registry.executors import EXECUTOR_ALIASES, EXECUTORS
from diffserve.registry.fronts import FRONTS
from diffserve.registry.models import MODEL_FAMILIES


def _choices(name: str) -> tuple[str, ...]:
    return next(f for f in dataclasses.fields(StageConfig) if f.name == name).metadata[
        "choices"
    ]


def test_backend_values_are_the_registry_tables() -> None:
    assert _choices("linear_backend") == ("auto", *LINEAR_BACKENDS.names())
    assert _choices("attention_backend") == ("auto", *ATTENTION_BACKENDS.names())
    for table, normalize in (
        (LINEAR_BACKENDS, c.normalize_linear_backend),
        (ATTENTION_BACKENDS, c.normalize_attention_backend),
    ):
        for spelling, name in table.aliases.items():
            assert normalize(spelling.upper()) == name  # TORCH and torch are one value
        for name in table.names():
            assert normalize(name) == name


def test_executor_values_are_the_registry_table() -> None:
    assert _choices("distributed_executor_backend") == tuple(EXECUTORS)
    assert all(
        c.normalize_executor(alias) == name for alias, name in EXECUTOR_ALIASES.items()
    )


def test_attention_roles_are_declared_by_the_model_families() -> None:
    assert set(ATTENTION_ROLES) == {
        r for f in MODEL_FAMILIES.values() for r in f.attention_roles
    }


def test_every_registry_target_imports() -> None:
    from diffserve.executor.base import Executor
    from diffserve.layers.backend import KernelBackend
    from diffserve.registry.targets import load_target

    for table in (LINEAR_BACKENDS, ATTENTION_BACKENDS):
        for name, target in table.targets.items():
            cls = load_target(target)
            assert issubclass(cls, KernelBackend) and cls.name == name
    for spec in EXECUTORS.values():
        assert issubclass(load_target(spec.target), Executor)
    for front in FRONTS.values():  # imports no Ray until run
        assert callable(load_target(front.target))
    for family in MODEL_FAMILIES.values():
        assert callable(family.load_pipeline_class().from_stage)


def test_single_file_components_are_the_registrys() -> None:
    """``components`` may name what some family reads; the native FLUX pipeline reads
    what its loaders do."""
    from diffserve.models.text_encoder_file import TEXT_ENCODER_FILES

    assert set(sv.SINGLE_FILE_COMPONENTS) == {
        x for f in MODEL_FAMILIES.values() for x in f.features.single_file_components
    }
    readers = {
        name: f.features.single_file_components
        for name, f in MODEL_FAMILIES.items()
        if f.features.single_file_components
    }
    assert set(readers) == {"FluxPipeline", "FluxKontextPipeline"}
    assert all(
        set(takes) == {"transformer", "vae", *TEXT_ENCODER_FILES}
        for takes in readers.values()
    )


def test_every_familys_edits_are_known_edit_kinds() -> None:
    from diffserve.registry.edits import EDIT_KINDS
    from diffserve.registry.models import MODEL_FAMILIES

    used = {
        kind for family in MODEL_FAMILIES.values() for kind in family.features.edits
    }
    assert used <= set(EDIT_KINDS), used - set(EDIT_KINDS)
    # First_frame: the Wan pipeline says it (image_to_video)
    assert {"img2img", "inpaint", "reference"} <= used
