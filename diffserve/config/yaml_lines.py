"""Load YAML keeping the line of every mapping key, so errors and provenance can say file:line.

Duplicate keys are an error here: plain PyYAML keeps the last one silently, which is exactly the
"my setting was ignored" class of bug.
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


class _Loader(yaml.SafeLoader):
    filename = "<yaml>"


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
            raise ConfigError("a mapping key must be a plain string", source=f"{loader.filename}:{line}",
                              hint="quote the key") from None
        if key in result:
            raise ConfigError(f"duplicate key {key!r} (first on line {result.lines[key]})",
                              source=f"{loader.filename}:{line}", hint="keep one of them")
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = line
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml_text(text: str, filename: str) -> Any:
    """Parse one YAML document; syntax errors become ConfigError with the line."""
    loader = _Loader(text)
    loader.filename = filename
    try:
        return loader.get_single_data()
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}" if mark else filename
        raise ConfigError(f"invalid YAML: {exc.problem or exc}", source=where,
                          hint="check indentation and quoting") from None
    except (yaml.YAMLError, RecursionError, ValueError, TypeError) as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=filename) from None
    finally:
        loader.dispose()


def load_yaml_file(path: Path) -> Any:
    """Read and parse a YAML file; a missing or unreadable file is a ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", source=str(path), hint="check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read file: {exc}", source=str(path)) from None
    return load_yaml_text(text, str(path))
