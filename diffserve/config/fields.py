"""The leaf settings, derived once from the schema dataclasses.

A *leaf* is one settable value: ``dtype``, ``parallel.ulysses_degree``,
``server.max_queue``, ``topology``. Each has a dotted ``key`` (its place in the YAML,
relative to a stage for stage leaves), a ``flat`` name (CLI flag ``--<flat>`` and env
variable ``DIFFSERVE_<FLAT>``), its default, its normalizer and its help text.
Everything else (sources, CLI, JSON Schema, docs) reads this table.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from diffserve.config import canonical as c
from diffserve.config.schema import DERIVED_STAGE_FIELDS, StageConfig
from diffserve.config.server_schema import ServerConfig
from diffserve.errors import ConfigError


@dataclass(frozen=True)
class Leaf:
    key: str  # "dtype", "parallel.ring_degree", "server.max_n", "topology"
    flat: str  # "dtype", "ring_degree", "max_n", "topology"
    # "stage" (per stage, or pipeline-wide for all stages) | "pipeline" (pipeline only)
    scope: str
    kind: str  # "str" | "int" | "float" | "bool" | "attention"
    default: Any
    doc: str
    normalize: c.Normalizer
    choices: tuple[str, ...] | None = None

    @property
    def section(self) -> str | None:
        return self.key.split(".", 1)[0] if "." in self.key else None


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    factory: Any = f.default_factory
    return factory()


def _leaves_of(
    cls: type, scope: str, key_prefix: str, flat_prefix: str
) -> Iterable[Leaf]:
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if f.name in DERIVED_STAGE_FIELDS or meta.get("kind") == "extras":
            continue
        if "section" in meta:
            yield from _leaves_of(
                meta["section"],
                scope,
                f"{key_prefix}{f.name}.",
                f"{flat_prefix}{meta['flat_prefix']}",
            )
            continue
        default = _default_of(f)
        if meta.get("kind") == "attention":
            default = default.default
        yield Leaf(
            key=f"{key_prefix}{f.name}",
            flat=f"{flat_prefix}{f.name}",
            scope=scope,
            kind=meta["kind"],
            default=default,
            doc=meta["doc"],
            normalize=meta["normalize"],
            choices=meta.get("choices"),
        )


TOPOLOGY_LEAF = Leaf(
    key="topology",
    flat="topology",
    scope="pipeline",
    kind="str",
    default="single",
    doc="stage layout: single (0 = diffusion) or split_text_encoder "
    "(0 = text_encoder, 1 = diffusion)",
    normalize=c.normalize_topology,
    choices=c.canonical_values(c.TOPOLOGY_ALIASES),
)

# host:port or ray://host:port (Ray Client); a bracketed IPv6 host is allowed.
_RAY_ADDRESS = re.compile(
    r"(ray://)?([a-z0-9][a-z0-9._-]*|\[[0-9a-f:]+\]):([0-9]{1,5})"
)


def normalize_ray_address(value: Any) -> str:
    """``""`` (start a local Ray), ``auto`` (join the running cluster) or
    ``[ray://]host:port``, lower-cased (host names are case-insensitive, so two
    spellings of one address fingerprint alike)."""
    if not isinstance(value, str):
        raise ConfigError(
            f"expected an address string, got {type(value).__name__}",
            hint='use "", auto, host:6379 or ray://host:10001',
        )
    text = value.strip().lower()
    if text in ("", "auto"):
        return text
    match = _RAY_ADDRESS.fullmatch(text)
    if match is None or not 0 < int(match.group(3)) < 65536:
        raise ConfigError(
            f"{value!r} is not a Ray address",
            hint='use "" (local Ray), auto (the running cluster), host:6379 '
            "or ray://host:10001",
        )
    return text


RAY_ADDRESS_LEAF = Leaf(
    key="ray_address",
    flat="ray_address",
    scope="pipeline",
    kind="str",
    default="",
    doc='where the ray executor runs: "" starts a local Ray (reused if this process '
    "already initialized one), auto joins the running cluster, or host:6379 / "
    "ray://host:10001",
    normalize=normalize_ray_address,
)
# Pipeline-only keys written at the top level of a deploy file (the server.* leaves sit
# in a section).
TOP_LEVEL_PIPELINE_LEAVES: Mapping[str, Leaf] = {
    leaf.key: leaf for leaf in (TOPOLOGY_LEAF, RAY_ADDRESS_LEAF)
}

STAGE_LEAVES: Mapping[str, Leaf] = {
    leaf.key: leaf for leaf in _leaves_of(StageConfig, "stage", "", "")
}
PIPELINE_LEAVES: Mapping[str, Leaf] = {
    **TOP_LEVEL_PIPELINE_LEAVES,
    **{leaf.key: leaf for leaf in _leaves_of(ServerConfig, "pipeline", "server.", "")},
}
FLAT_LEAVES: Mapping[str, Leaf] = {
    leaf.flat: leaf for leaf in (*STAGE_LEAVES.values(), *PIPELINE_LEAVES.values())
}
assert len(FLAT_LEAVES) == len(STAGE_LEAVES) + len(PIPELINE_LEAVES), (
    "flat option names collide"
)

# Keys a stage mapping accepts directly (sections and the extras bag included).
STAGE_KEYS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(StageConfig)
    if f.name not in DERIVED_STAGE_FIELDS
)
SECTIONS: Mapping[str, Mapping[str, Leaf]] = {
    name: {
        leaf.key.split(".", 1)[1]: leaf
        for leaf in (*STAGE_LEAVES.values(), *PIPELINE_LEAVES.values())
        if leaf.section == name
    }
    for name in (
        *(f.name for f in dataclasses.fields(StageConfig) if "section" in f.metadata),
        "server",
    )
}


def did_you_mean(word: object, candidates: Iterable[str]) -> str | None:
    """A ``did you mean`` hint for a misspelled key, or None when nothing is close."""
    if not isinstance(word, str):
        return None
    matches = difflib.get_close_matches(word.lower(), list(candidates), n=1, cutoff=0.6)
    return f"did you mean {matches[0]!r}?" if matches else None
