"""Load YAML keeping the line of every mapping key, so errors and provenance can say
file:line.

Duplicate keys are an error here: plain PyYAML keeps the last one silently, which is
exactly the "my setting was ignored" class of bug.

The loader is also bounded (file size, aliases, nodes after alias expansion, nesting
depth), checked while the document is composed and before anything is constructed: an
alias bomb ("billion laughs", a few hundred bytes expanding to 9**9 nodes) must fail in
milliseconds, not hang ``config validate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from diffserve.errors import ConfigError


class LineDict(dict):
    """A dict from YAML that knows the line of each key (1-based) and of itself."""

    line: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines: dict[Any, int] = {}


def key_line(mapping: Any, key: Any) -> int | None:
    """Line of ``key`` in a mapping loaded by this module; None for plain dicts."""
    lines = getattr(mapping, "lines", None)
    return lines.get(key) if lines else None


# Far above any real deploy file (the documented example has ~60 nodes and no aliases),
# far below anything that takes noticeable time or memory to walk.
MAX_FILE_BYTES = 1024 * 1024
MAX_ALIASES = 100
MAX_NODES = 10_000
MAX_DEPTH = 64

_ALIAS_HINT = "remove the anchors/aliases and write the values out"


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps key lines and refuses documents over the limits above."""

    filename = "<yaml>"

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        # Nodes of the fully expanded document: an alias adds its target's size.
        self._nodes = 0
        self._depth = 0
        # Id(node) -> expanded size, recorded once the node is complete.
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise self._limit(event, f"more than {MAX_ALIASES} aliases (*name)")
            target = self.anchors.get(event.anchor)
            if target is not None:
                if id(target) not in self._sizes:
                    # The anchor's node is still being composed: the alias is inside its
                    # own anchor.
                    raise self._limit(
                        event, f"alias *{event.anchor} refers to its own enclosing node"
                    )
                self._count(event, self._sizes[id(target)])
            return super().compose_node(parent, index)
        event = self.peek_event()
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise self._limit(
                event,
                f"nested deeper than {MAX_DEPTH} levels",
                hint="flatten the structure",
            )
        before = self._nodes
        self._count(event, 1)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = self._nodes - before
        return node

    def _count(self, event: yaml.Event, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise self._limit(
                event, f"more than {MAX_NODES} nodes once aliases are expanded"
            )

    def _limit(
        self, event: yaml.Event, rule: str, hint: str = _ALIAS_HINT
    ) -> ConfigError:
        return ConfigError(
            rule, source=f"{self.filename}:{event.start_mark.line + 1}", hint=hint
        )


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    result = LineDict()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise ConfigError(
                "a mapping key must be a plain string",
                source=f"{loader.filename}:{line}",
                hint="quote the key",
            ) from None
        if key in result:
            raise ConfigError(
                f"duplicate key {key!r} (first on line {result.lines[key]})",
                source=f"{loader.filename}:{line}",
                hint="keep one of them",
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = line
    return result


_Loader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def load_yaml_text(text: str, filename: str) -> Any:
    """Parse one YAML document; syntax errors become ConfigError with the line."""
    if len(text) > MAX_FILE_BYTES:
        raise _too_large(filename)
    loader = _Loader(text)
    loader.filename = filename
    try:
        return loader.get_single_data()
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}" if mark else filename
        raise ConfigError(
            f"invalid YAML: {exc.problem or exc}",
            source=where,
            hint="check indentation and quoting",
        ) from None
    except (yaml.YAMLError, RecursionError, ValueError, TypeError) as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=filename) from None
    finally:
        loader.dispose()


def load_yaml_file(path: Path) -> Any:
    """Read and parse a YAML file; a missing or unreadable file is a ConfigError."""
    try:
        # Read at most one byte past the limit, so a huge (or endless, e.g. /dev/zero)
        # file is never pulled into memory just to be refused.
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise _too_large(str(path))
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(
            "file not found", source=str(path), hint="check the path"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file: {exc}", source=str(path)) from None
    return load_yaml_text(text, str(path))


def _too_large(filename: str) -> ConfigError:
    return ConfigError(
        f"larger than {MAX_FILE_BYTES // 1024} KiB, the limit for a config file",
        source=filename,
        hint="a deploy config is a few hundred lines; check that "
        "this is the right file",
    )
