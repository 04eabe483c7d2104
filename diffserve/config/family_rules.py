"""What the model family allows a deployment, checked at resolve: the implementation and
stage roles it has, its text window, the generic path's step cache and the components
it reads from single files. Each check returns the ``ConfigError``s it found (all are
reported together)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from diffserve.config.provenance import Source
from diffserve.config.schema import StageConfig
from diffserve.errors import ConfigError
from diffserve.registry.models import MODEL_FAMILIES


def implementation_errors(
    stages: tuple[StageConfig, ...], family: Any, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """``implementation: native`` on a family that only the generic path serves (the
    reverse is allowed: any family can run on diffusers' own pipeline class); a topology
    with a stage role the family has no pipeline for (the generic path runs diffusers'
    pipeline whole: one stage)."""
    errors = []
    if family is not None:
        roles = dict(family.features.stage_pipelines)
        for stage in stages:
            if stage.role == "diffusion":
                continue
            generic = (
                any(s.implementation == "generic" for s in stages)
                or family.implementation == "generic"
            )
            if stage.role not in roles or generic:
                errors.append(
                    ConfigError(
                        f"{family.class_name} "
                        f"on the {'generic' if generic else 'native'} "
                        "path has no "
                        f"{stage.role} stage",
                        path="topology",
                        source=provenance["topology"].describe(),
                        hint="use topology: single"
                        + (
                            f" (a {stage.role} stage runs on: "
                            + ", ".join(
                                n
                                for n, f in MODEL_FAMILIES.items()
                                if stage.role in dict(f.features.stage_pipelines)
                            )
                            + ")"
                            if stage.role
                            else ""
                        ),
                    )
                )
    if family is None or family.implementation == "native":
        return errors
    return errors + [
        ConfigError(
            f"{family.class_name} has no native implementation",
            path=key,
            source=provenance[key].describe(),
            hint="use implementation: generic (or leave it unset)",
        )
        for key in (
            f"stages.{s.stage_id}.implementation"
            for s in stages
            if s.implementation == "native"
        )
    ]


def text_window_errors(
    stages: tuple[StageConfig, ...], family: Any, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """A default text length past the model's window: every request that sends none
    would be refused."""
    errors: list[ConfigError] = []
    for stage in stages:
        length, key = (
            stage.request_defaults.max_sequence_length,
            f"stages.{stage.stage_id}.request_defaults.max_sequence_length",
        )
        if (
            family is not None
            and length is not None
            and length > family.defaults.max_sequence_length
        ):
            errors.append(
                ConfigError(
                    f"{length} text tokens is past {family.class_name}'s window of "
                    f"{family.defaults.max_sequence_length}",
                    path=key,
                    source=provenance[key].describe(),
                    hint=f"use at most {family.defaults.max_sequence_length} "
                    "(or leave it unset)",
                )
            )
    return errors


def generic_cache_errors(
    stages: tuple[StageConfig, ...], family: Any, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """A step cache on the generic path: First-Block Cache where the family names its
    blocks, eager; TeaCache nowhere (its polynomial is fitted per family, and none is
    published for these)."""
    errors: list[ConfigError] = []
    for stage in stages:
        generic = stage.implementation == "generic" or (
            family is not None and family.implementation == "generic"
        )
        backend, key = stage.cache.backend, f"stages.{stage.stage_id}.cache.backend"
        if family is None or not generic or backend == "none":
            continue
        source = provenance[key].describe()
        if backend == "teacache":
            errors.append(
                ConfigError(
                    "TeaCache rescales its signal with a polynomial fitted "
                    "per model family, and none is published for "
                    f"{family.class_name}",
                    path=key,
                    source=source,
                    hint="use cache.backend: fbcache"
                    if family.generic.first_block_cache
                    else "use cache.backend: none",
                )
            )
        elif family.generic.first_block_cache is None:
            errors.append(
                ConfigError(
                    f"{family.class_name} on the generic path has no step cache",
                    path=key,
                    source=source,
                    hint="use cache.backend: none"
                    + (
                        " (or implementation: native, which has one)"
                        if family.implementation == "native"
                        else ""
                    ),
                )
            )
        elif not stage.enforce_eager:
            errors.append(
                ConfigError(
                    "First-Block Cache on the generic path runs eager (a "
                    "compiled block is counted per forward, and a "
                    "skipped one would be counted too)",
                    path=f"stages.{stage.stage_id}.enforce_eager",
                    source=provenance[
                        f"stages.{stage.stage_id}.enforce_eager"
                    ].describe(),
                    hint="set enforce_eager: true",
                )
            )
    return errors


def component_errors(
    stages: tuple[StageConfig, ...], family: Any, provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """Single-file components: the file must exist, the stage must run its family's
    native path, and the family must read that component from a file (the registry's
    ``single_file_components``)."""
    errors = []
    for stage in stages:
        key = f"stages.{stage.stage_id}.components"
        for name, path in stage.components.items():
            if not os.path.isfile(path):
                errors.append(
                    ConfigError(
                        f"{name}: no such file {path}",
                        path=f"{key}.{name}",
                        source=provenance[key].describe(),
                        hint="give an existing .safetensors file",
                    )
                )
        if (
            stage.components.get("transformer", "").endswith(".gguf")
            and not stage.enforce_eager
        ):
            errors.append(
                ConfigError(
                    "a GGUF transformer runs eager (its weights are dequantized "
                    "per call)",
                    path=f"stages.{stage.stage_id}.enforce_eager",
                    source=provenance[
                        f"stages.{stage.stage_id}.enforce_eager"
                    ].describe(),
                    hint="set enforce_eager: true (--enforce-eager)",
                )
            )
        if not stage.components or family is None:
            continue
        if stage.implementation != "native" or family.implementation != "native":
            errors.append(
                ConfigError(
                    "single-file components are read on the native path "
                    f"only (by {single_file_readers()}); "
                    f"{family.class_name} runs on the {stage.implementation} path here",
                    path=key,
                    source=provenance[key].describe(),
                    hint="serve the component from the model's folder, or use "
                    "implementation: native",
                )
            )
            continue
        takes = (
            f"it reads {', '.join(family.features.single_file_components)} "
            "from single files"
            if family.features.single_file_components
            else "it reads no component from a single file"
        )
        for name in stage.components:
            if name not in family.features.single_file_components:
                # Refused, not ignored: the file would otherwise be fingerprinted as
                # served and never read.
                errors.append(
                    ConfigError(
                        f"{family.class_name} does not read its {name} from "
                        f"a single file ({takes})",
                        path=f"{key}.{name}",
                        source=provenance[key].describe(),
                        hint=f"serve the {name} from "
                        "the model's folder: "
                        f"drop components.{name}",
                    )
                )
    return errors


def single_file_readers() -> str:
    """The families whose native pipeline reads some component from a single file."""
    return (
        ", ".join(
            name
            for name, f in MODEL_FAMILIES.items()
            if f.features.single_file_components
        )
        or "none"
    )
