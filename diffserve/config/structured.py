"""Normalizers of the structured values (host lists, module name patterns, device lists,
class paths, LoRA modules, single-file components, directories, job-store URLs): each
turns what a source wrote into the one canonical value, or raises ``ConfigError`` with
the rule and a hint (as ``canonical.py`` does for the enum-like fields)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from diffserve.config.frozen import FrozenDict
from diffserve.errors import ConfigError
from diffserve.registry.models import known_single_file_components

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")


_DEVICES = re.compile(r"^\d+(,\d+)*$")


_MODULE_PATTERN = re.compile(r"^[\w*?\[\]!-]+(\.[\w*?\[\]!-]+)*$")


_HOST = re.compile(
    r"^(\*|[a-z0-9*]([a-z0-9.*-]{0,252}))(:\d{1,5})?$|^\[[0-9a-f:.]+\](:\d{1,5})?$"
)


def comma_list(value: Any, what: str, hint: str) -> list[str]:
    """A list setting's items: a YAML list, or comma-separated text (flags,
    environment), stripped, empty ones dropped; ``None`` is none."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise ConfigError(f"{value!r} is not {what}", hint=hint)
    return [item.strip() for item in value.split(",") if item.strip()]


def normalize_host_list(value: Any) -> tuple[str, ...]:
    """``Host`` header values (``example.com``, ``127.0.0.1:8000``, ``*.corp``), a list
    or comma-separated (flags, environment); canonical: a tuple, lower-cased, duplicates
    dropped. Empty: any host."""
    hosts = [
        h.lower()
        for h in comma_list(
            value, "a host list", 'write hosts like "localhost,127.0.0.1"'
        )
    ]
    bad = [h for h in hosts if not _HOST.match(h)]
    if bad:
        raise ConfigError(
            f"{bad[0]!r} is not a host name",
            hint='write hosts like "localhost,127.0.0.1:8000"',
        )
    return tuple(dict.fromkeys(hosts))


def normalize_module_patterns(value: Any) -> tuple[str, ...]:
    """Module-name patterns (``final_layer``, ``*.img_mod.lin``): a list or
    comma-separated (flags, environment); canonical: a tuple without duplicates, in the
    order given. Empty: nothing."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, str) for v in value
    ):
        raise ConfigError(
            f"{value!r} is not a list of module-name patterns",
            hint='write patterns like "final_layer,*.img_mod.lin" or a YAML list',
        )
    patterns = [v.strip() for v in value if v.strip()]
    bad = [p for p in patterns if not _MODULE_PATTERN.match(p)]
    if bad:
        raise ConfigError(
            f"{bad[0]!r} is not a module-name pattern",
            hint="dotted module names "
            "with * and ? wildcards, "
            "e.g. double_blocks.*.img_mod.lin",
        )
    return tuple(dict.fromkeys(patterns))


def normalize_devices(value: Any) -> tuple[int, ...]:
    """Device indices: ``auto`` (or empty: pick), an index, a list of them or ``"0,1"``;
    canonical: a tuple of ints (``()`` for auto)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return (value,)
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return tuple(value)
    if isinstance(value, str):
        text = value.replace(" ", "").lower()
        if text in ("auto", ""):
            return ()
        if _DEVICES.match(text):
            return tuple(int(d) for d in text.split(","))
    raise ConfigError(
        f"{value!r} is not a device list",
        hint='use auto or indices like 0, [0, 1] or "0,1"',
    )


def normalize_class_path(value: Any) -> str:
    """A dotted import path (``pkg.module.Class``); checked for shape only, never
    imported here."""
    if isinstance(value, str) and _DOTTED.match(value.strip()):
        return value.strip()
    raise ConfigError(
        f"{value!r} is not a dotted import path",
        hint="write it like my_pkg.module.ClassName",
    )


_LORA_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def normalize_lora_modules(value: Any) -> FrozenDict:
    """LoRA adapters registered at start: a mapping ``{name: path}`` (YAML), or
    ``name=path`` items separated by commas (flags, environment), or a list of them.
    Canonical: ``{name: /abs/path}`` sorted by name."""
    if value is None or value == "":
        return FrozenDict()
    if isinstance(value, Mapping):
        items = list(value.items())
    else:
        parts = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(p, str) for p in parts):
            raise ConfigError(
                f"{value!r} is not a LoRA list",
                hint="write name=path (several: a=x.safetensors,b=y.safetensors)",
            )
        items = []
        for part in (p.strip() for text in parts for p in text.split(",")):
            if part:
                if "=" not in part:
                    raise ConfigError(
                        f"{part!r} is not name=path",
                        hint="write name=path, e.g. style=/loras/style.safetensors",
                    )
                items.append(tuple(s.strip() for s in part.split("=", 1)))
    out: dict[str, str] = {}
    for name, path in items:
        if not isinstance(name, str) or not _LORA_NAME.match(name):
            raise ConfigError(
                f"LoRA name {name!r} must be 1-64 letters, digits, '_', '.', '-'",
                hint="rename it",
            )
        if not isinstance(path, str) or not path.strip() or "," in path:
            raise ConfigError(
                f"LoRA {name!r}: {path!r} is not a file path (without commas)",
                hint="give the path of a .safetensors file",
            )
        if name in out:
            raise ConfigError(
                f"LoRA name {name!r} is registered twice",
                hint="give each adapter its own name",
            )
        out[name] = os.path.abspath(os.path.expanduser(path.strip()))
    return FrozenDict({name: out[name] for name in sorted(out)})


# Components a single file may replace in some family (the registry's
# ``single_file_components``; which ones the served family takes is checked at resolve).
SINGLE_FILE_COMPONENTS = known_single_file_components()


def normalize_components(value: Any) -> FrozenDict:
    """``{component: path}`` (YAML), or ``component=path`` items separated by commas
    (flags, environment). Canonical: absolute paths, sorted by component; only
    ``SINGLE_FILE_COMPONENTS`` may be named."""
    if value is None or value == "":
        return FrozenDict()
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, str):
        items = []
        for part in (p.strip() for p in value.split(",")):
            if part:
                if "=" not in part:
                    raise ConfigError(
                        f"{part!r} is not component=path",
                        hint="write transformer=/models/flux1-dev.safetensors",
                    )
                name, path = part.split("=", 1)
                items.append((name.strip(), path.strip()))
    else:
        raise ConfigError(
            f"{value!r} is not a mapping of component -> file",
            hint="write {transformer: path}",
        )
    out: dict[str, str] = {}
    for name, path in items:
        if name not in SINGLE_FILE_COMPONENTS:
            raise ConfigError(
                f"{name!r} cannot come from a single file",
                hint=f"name one of: {', '.join(SINGLE_FILE_COMPONENTS)}",
            )
        if not isinstance(path, str) or not path.strip():
            raise ConfigError(
                f"{name}: {path!r} is not a file path",
                hint="give the path of a .safetensors file",
            )
        out[name] = os.path.abspath(os.path.expanduser(path.strip()))
    return FrozenDict({name: out[name] for name in sorted(out)})


def normalize_optional_dir(value: Any) -> str:
    """A directory path (made absolute) or empty for none; existence is checked where it
    is used."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise ConfigError(
            f"{value!r} is not a directory path",
            hint="give a directory, or leave it empty",
        )
    return os.path.abspath(os.path.expanduser(value.strip()))


_JOB_STORE_SCHEMES = {
    "sqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}


def normalize_job_store_url(value: Any) -> str:
    """The video job store's database URL: empty (SQLite in ``server.state_dir``),
    ``sqlite:///PATH`` or ``postgresql://user@host:port/db`` (canonical:
    ``postgresql+psycopg://``, the driver diffserve installs)."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or "://" not in value:
        raise ConfigError(
            f"{value!r} is not a database URL",
            hint="write sqlite:///PATH or postgresql://USER@HOST:PORT/DB "
            "(or leave it empty for "
            "SQLite in server.state_dir)",
        )
    scheme, rest = value.strip().split("://", 1)
    canonical = _JOB_STORE_SCHEMES.get(scheme.lower())
    if canonical is None:
        raise ConfigError(
            f"database scheme {scheme!r} is not supported",
            hint="use sqlite:///PATH or postgresql://USER@HOST:PORT/DB",
        )
    if canonical == "sqlite":
        path = rest[1:] if rest.startswith("/") else ""
        if not path:
            raise ConfigError(
                f"{value!r} names no file",
                hint="write sqlite:///PATH (an absolute or relative path)",
            )
        return "sqlite:///" + os.path.abspath(os.path.expanduser(path))
    return f"{canonical}://{rest}"
