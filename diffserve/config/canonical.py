"""Canonical spellings: one normalizer per enum-like field, applied at ingress by every
source.

Every value that enters the resolver passes through exactly one of these functions, so
merging, conflict checks, warnings and the fingerprint only ever see canonical values
(``TORCH`` -> ``torch``, ``torch_sdpa`` -> ``sdpa``, ``bf16`` -> ``bfloat16``). A
normalizer raises ``ConfigError`` carrying the rule and a hint; the caller adds the key
path and the source location.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from diffserve.config.frozen import FrozenDict
from diffserve.errors import ConfigError
from diffserve.registry.backends import ATTENTION_BACKENDS, LINEAR_BACKENDS
from diffserve.registry.caches import cache_spellings
from diffserve.registry.executors import executor_spellings
from diffserve.registry.models import known_single_file_components
from diffserve.registry.quantization import offload_spellings, quantization_spellings
from diffserve.registry.teacache import teacache_spellings

Normalizer = Callable[[Any], Any]

# Alias tables: spelling (already lower-cased, '-' -> '_') -> canonical value.
DTYPE_ALIASES: Mapping[str, str] = {
    "auto": "auto",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "torch.float32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "torch.bfloat16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "torch.float16": "float16",
}
# Backends, caches and executors: their tables live in the registries the runtime loads
# from (one home each).
LINEAR_BACKEND_ALIASES: Mapping[str, str] = LINEAR_BACKENDS.spellings()
ATTENTION_BACKEND_ALIASES: Mapping[str, str] = ATTENTION_BACKENDS.spellings()
EXECUTOR_ALIASES: Mapping[str, str] = executor_spellings()
CACHE_BACKEND_ALIASES: Mapping[str, str] = cache_spellings()
TEACACHE_ALIASES: Mapping[str, str] = teacache_spellings()
QUANTIZATION_ALIASES: Mapping[str, str] = quantization_spellings()
OFFLOAD_ALIASES: Mapping[str, str] = offload_spellings()
BATCHING_ALIASES: Mapping[str, str] = {
    "step": "step",
    "step_level": "step",
    "continuous": "step",
    "request": "request",
    "request_level": "request",
}
VAE_TILING_ALIASES: Mapping[str, str] = {
    "auto": "auto",
    "on": "on",
    "true": "on",
    "yes": "on",
    "always": "on",
    "off": "off",
    "false": "off",
    "no": "off",
    "never": "off",
}
IMPLEMENTATION_ALIASES: Mapping[str, str] = {
    "native": "native",
    "generic": "generic",
    "diffusers": "generic",
}
TOPOLOGY_ALIASES: Mapping[str, str] = {
    "single": "single",
    "split_text_encoder": "split_text_encoder",
    "encode_denoise_decode": "encode_denoise_decode",
}
PLATFORM_ALIASES: Mapping[str, str] = {
    "cpu": "cpu",
    "cuda": "cuda",
    "rocm": "rocm",
    "hip": "rocm",
    "xpu": "xpu",
    "mps": "mps",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_DEVICES = re.compile(r"^\d+(,\d+)*$")
_MODULE_PATTERN = re.compile(r"^[\w*?\[\]!-]+(\.[\w*?\[\]!-]+)*$")


def canonical_values(aliases: Mapping[str, str]) -> tuple[str, ...]:
    """The distinct canonical values of an alias table, in table order."""
    return tuple(dict.fromkeys(aliases.values()))


def _spelling(value: Any, what: str, valid: tuple[str, ...]) -> str:
    if isinstance(value, str):
        return value.strip().lower().replace("-", "_")
    # torch.dtype objects stringify as "torch.bfloat16"; matching the module name avoids
    # importing torch.
    if type(value).__module__.startswith("torch"):
        return str(value).lower()
    raise ConfigError(
        f"{what} must be a string, got {type(value).__name__} {value!r}",
        hint=f"use one of {', '.join(valid)}",
    )


def enum_normalizer(what: str, aliases: Mapping[str, str]) -> Normalizer:
    """Build the normalizer of one enum-like field from its alias table."""
    valid = canonical_values(aliases)

    def normalize(value: Any) -> str:
        key = _spelling(value, what, valid)
        if key in aliases:
            return aliases[key]
        close = difflib.get_close_matches(key, list(aliases), n=1, cutoff=0.6)
        suggestion = f"did you mean {aliases[close[0]]!r}? " if close else ""
        raise ConfigError(
            f"{value!r} is not a valid {what}; valid values: {', '.join(valid)}",
            hint=f"{suggestion}use one of {', '.join(valid)}",
        )

    normalize.__name__ = f"normalize_{what.replace(' ', '_')}"
    normalize.valid = valid  # type: ignore[attr-defined]
    normalize.aliases = aliases  # type: ignore[attr-defined]
    return normalize


normalize_dtype = enum_normalizer("dtype", DTYPE_ALIASES)
normalize_linear_backend = enum_normalizer("linear backend", LINEAR_BACKEND_ALIASES)
normalize_attention_backend = enum_normalizer(
    "attention backend", ATTENTION_BACKEND_ALIASES
)
normalize_executor = enum_normalizer("executor backend", EXECUTOR_ALIASES)
normalize_cache_backend = enum_normalizer("cache backend", CACHE_BACKEND_ALIASES)
normalize_teacache_polynomial = enum_normalizer("TeaCache polynomial", TEACACHE_ALIASES)
normalize_topology = enum_normalizer("topology", TOPOLOGY_ALIASES)
normalize_batching = enum_normalizer("batching mode", BATCHING_ALIASES)
normalize_implementation = enum_normalizer("implementation", IMPLEMENTATION_ALIASES)
normalize_vae_tiling = enum_normalizer("VAE tiling mode", VAE_TILING_ALIASES)
normalize_platform = enum_normalizer("platform", PLATFORM_ALIASES)
normalize_quantization = enum_normalizer("quantization method", QUANTIZATION_ALIASES)
normalize_offload = enum_normalizer("offload mode", OFFLOAD_ALIASES)


def normalize_bool(value: Any) -> bool:
    """true/false, and from env or CLI text 1/0, yes/no, on/off (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ConfigError(f"{value!r} is not a boolean", hint="use true or false")


def int_normalizer(minimum: int = 0, multiple_of: int = 1) -> Normalizer:
    """Integers (or their decimal text, as env and CLI give them) at least
    ``minimum``."""

    def normalize(value: Any) -> int:
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d{1,19}\s*", value):
            value = int(value)
        # bool is an int subclass; `true` for a size is a mistake, not 1.
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(
                f"{value!r} is not an integer", hint="write a whole number like 4"
            )
        if value < minimum:
            raise ConfigError(
                f"{value} is below the minimum {minimum}",
                hint=f"use a value >= {minimum}",
            )
        if value % multiple_of:
            raise ConfigError(
                f"{value} is not a multiple of {multiple_of}",
                hint=f"round to a multiple of {multiple_of}",
            )
        return value

    normalize.minimum = minimum  # type: ignore[attr-defined]
    return normalize


def float_normalizer(minimum: float, maximum: float) -> Normalizer:
    """Finite numbers (or their decimal text) in ``[minimum, maximum]``; ``inf``/``nan``
    are refused."""

    def normalize(value: Any) -> float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ConfigError(
                    f"{value!r} is not a number", hint="write a number like 2.5"
                ) from None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(
                f"{value!r} is not a number", hint="write a number like 2.5"
            )
        value = float(value)
        if not math.isfinite(value) or not minimum <= value <= maximum:
            raise ConfigError(
                f"{value} is outside [{minimum}, {maximum}]",
                hint=f"use a value between {minimum} and {maximum}",
            )
        return value

    normalize.minimum = minimum  # type: ignore[attr-defined]
    normalize.maximum = maximum  # type: ignore[attr-defined]
    return normalize


_HOST = re.compile(
    r"^(\*|[a-z0-9*]([a-z0-9.*-]{0,252}))(:\d{1,5})?$|^\[[0-9a-f:.]+\](:\d{1,5})?$"
)


def normalize_host_list(value: Any) -> tuple[str, ...]:
    """``Host`` header values (``example.com``, ``127.0.0.1:8000``, ``*.corp``), a list
    or comma-separated (flags, environment); canonical: a tuple, lower-cased, duplicates
    dropped. Empty: any host."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    if not isinstance(value, str):
        raise ConfigError(
            f"{value!r} is not a host list",
            hint='write hosts like "localhost,127.0.0.1"',
        )
    hosts = [h.strip().lower() for h in value.split(",") if h.strip()]
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
