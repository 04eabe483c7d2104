"""Optional packages a resolved setting needs: missing ones are a ``ConfigError`` at
resolve time.

An executor that needs a module diffserve does not install by default
(``ExecutorSpec.requires``, e.g. ``ray``) is refused when the config is resolved, naming
the extra that installs it, instead of failing later inside ``make_executor`` or
silently running on another executor. Only ``importlib.util.find_spec`` is used:
resolving a config never imports the optional package.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping

from diffserve.config.provenance import DEFAULT_SOURCE, Source
from diffserve.config.schema import StageConfig
from diffserve.errors import ConfigError
from diffserve.registry.executors import EXECUTORS


def module_available(name: str) -> bool:
    """True when ``name`` can be imported here (its top-level package is installed)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (
        ImportError,
        ValueError,
    ):  # a broken parent package or an odd name: not usable either
        return False


def missing_requirements(
    stages: tuple[StageConfig, ...], provenance: Mapping[str, Source]
) -> list[ConfigError]:
    """One error per stage whose executor needs a module that is not installed."""
    errors = []
    for stage in stages:
        spec = EXECUTORS.get(stage.distributed_executor_backend)
        if spec is None or spec.requires is None or module_available(spec.requires):
            continue
        key = f"stages.{stage.stage_id}.distributed_executor_backend"
        install = (
            f'pip install "diffserve[{spec.extra}]"'
            if spec.extra
            else f"pip install {spec.requires}"
        )
        errors.append(
            ConfigError(
                f"executor {spec.name!r} needs the {spec.requires!r} "
                "package, which is not installed",
                path=key,
                source=provenance.get(key, DEFAULT_SOURCE).describe(),
                hint=f"{install}, or choose another distributed_executor_backend",
            )
        )
    return errors
