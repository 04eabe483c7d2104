"""Deploy configuration: one resolver from deploy YAML, platform overlays, env and CLI
to a typed, frozen config with provenance.

Imported eagerly (it is cheap: PyYAML and the standard library, never torch). Eager on
purpose: with a lazy ``__getattr__``, ``from diffserve.config import resolve`` would
return the ``resolve`` *module* once anything had imported ``diffserve.config.resolve``,
because importing a submodule binds its name on the package.
"""

from __future__ import annotations

from diffserve.config.resolve import resolve
from diffserve.config.resolved import ResolvedConfig
from diffserve.config.schema import StageConfig

__all__ = ["ResolvedConfig", "StageConfig", "resolve"]
