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
import re
from collections.abc import Callable, Mapping
from typing import Any

from diffserve.errors import ConfigError
from diffserve.registry.backends import ATTENTION_BACKENDS, LINEAR_BACKENDS
from diffserve.registry.caches import cache_spellings
from diffserve.registry.executors import executor_spellings
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
