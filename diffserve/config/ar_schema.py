"""An autoregressive (AR) stage: an LLM that vLLM runs in front of the diffusion stages.

A ``stages:`` entry with ``kind: ar`` holds two sorts of keys. diffserve's own
(``AR_KEYS`` below: its role, its model, the chat it runs, its sampling defaults,
replicas, the KV connector of a prefill/decode pair) and vLLM's engine settings, written
flat as vLLM-Omni's deploy files write them (``dtype``, ``tensor_parallel_size``,
``max_num_seqs``...): any ``vllm.EngineArgs`` field, checked by name against the
installed vLLM (``vllm_args.py``). The well-known ones are normalized here, so ``dtype:
bf16`` and ``dtype: bfloat16`` fingerprint alike; the rest reach ``EngineArgs`` as
written (plain data) and vLLM checks them at start.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diffserve.config import canonical as c
from diffserve.config.frozen import FrozenDict
from diffserve.errors import ConfigError

# What an AR stage does: rewrite the prompt (one engine), or the two halves of one
# rewrite with the prompt's KV handed from the prefill engine to the decode engine
# through a vLLM KV connector.
AR_ROLES: tuple[str, ...] = ("prompt_rewrite", "prefill", "decode")
# The KV connector of a prefill/decode pair on CPU: vLLM's file-based one (the CUDA
# ones: docs/config.md).
DEFAULT_KV_CONNECTOR = "ExampleConnector"


def _role(value: Any) -> str:
    return c.enum_normalizer("ar role", {r: r for r in AR_ROLES})(value)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(
            f"{value!r} is not text", hint="write a string (quote it in YAML)"
        )
    return value


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"{value!r} is not a model",
            hint="give an LLM's directory or a hub id org/name",
        )
    return value.strip()


def plain_data(value: Any, path: str = "value") -> Any:
    """Plain data (what YAML gives) frozen: mappings, lists as tuples, scalars."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return FrozenDict(
            {str(k): plain_data(v, f"{path}.{k}") for k, v in value.items()}
        )
    if isinstance(value, (list, tuple)):
        return tuple(plain_data(v, f"{path}[{i}]") for i, v in enumerate(value))
    raise ConfigError(
        f"{path} of type {type(value).__name__} is not plain data",
        hint="use YAML scalars, lists, maps",
    )


def _mapping(value: Any) -> FrozenDict:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{value!r} is not a mapping", hint="write {key: value, ...}")
    return plain_data(value)


# diffserve's own keys of an AR stage: key -> (normalizer, default, doc).
AR_KEYS: Mapping[str, tuple[c.Normalizer, Any, str]] = {
    "role": (
        _role,
        "prompt_rewrite",
        "prompt_rewrite: the LLM rewrites the prompt before the diffusion stages; "
        "prefill / decode: one rewrite split over two stages, "
        "the prompt's KV handed over by kv_connector",
    ),
    "model": (
        _model,
        None,
        "the LLM: a directory (relative to this file) or a hub id, offline first",
    ),
    "system_prompt": (_text, "", "the chat's system message (the rewrite instruction)"),
    "default_sampling_params": (
        _mapping,
        FrozenDict(),
        "vLLM SamplingParams of every request: temperature, "
        "max_tokens, top_p, top_k, seed, stop, ...",
    ),
    "num_replicas": (c.int_normalizer(1), 1, "independent vLLM engines of this stage"),
    "kv_connector": (
        _text,
        DEFAULT_KV_CONNECTOR,
        "prefill/decode: vLLM's KV connector class name",
    ),
    "kv_connector_extra_config": (
        _mapping,
        FrozenDict(),
        "prefill/decode: the connector's settings (default for "
        "ExampleConnector: shared_storage_path in a private temporary folder)",
    ),
    "timeout_s": (
        c.float_normalizer(1.0, 86400.0),
        120.0,
        "seconds one request may spend in this stage "
        "(then it fails with 503 naming the stage)",
    ),
    "warmup": (
        c.normalize_bool,
        True,
        "draw one short rewrite at start, before the stage reports ready, so the "
        "first request does not pay vLLM's first-step costs",
    ),
}
# vLLM's engine settings diffserve normalizes (the rest pass as plain data): key ->
# normalizer.
_VLLM_DTYPES = {
    "auto": "auto",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}
VLLM_KEYS: Mapping[str, c.Normalizer] = {
    "dtype": c.enum_normalizer("vLLM dtype", _VLLM_DTYPES),
    "tensor_parallel_size": c.int_normalizer(1),
    "pipeline_parallel_size": c.int_normalizer(1),
    "data_parallel_size": c.int_normalizer(1),
    "enable_expert_parallel": c.normalize_bool,
    "max_num_seqs": c.int_normalizer(1),
    "max_model_len": c.int_normalizer(16),
    "max_num_batched_tokens": c.int_normalizer(16),
    "enforce_eager": c.normalize_bool,
    "enable_prefix_caching": c.normalize_bool,
    "kv_cache_memory_bytes": c.int_normalizer(1 << 20),
    "block_size": c.int_normalizer(1),
    "seed": c.int_normalizer(0),
    "distributed_executor_backend": c.enum_normalizer(
        "vLLM executor",
        {"uni": "uni", "mp": "mp", "ray": "ray", "multiprocessing": "mp"},
    ),
}
# EngineArgs fields diffserve sets itself: written by a user they would be overwritten,
# so they are refused.
OWNED_ENGINE_ARGS: Mapping[str, str] = {
    "model": "the stage's model key is the LLM",
    "worker_extension_cls": "diffserve installs its "
    "own worker extension "
    "(the attestation "
    "probe)",
    "kv_transfer_config": "set role: prefill / "
    "decode and kv_connector "
    "(kv_connector_extra_config) "
    "instead",
}
# Defaults diffserve gives vLLM settings (recorded as default): the stage runs in the
# server's process unless it asks for worker processes, and its sampling seed is fixed.
VLLM_DEFAULTS: Mapping[str, Any] = {"distributed_executor_backend": "uni", "seed": 0}
# The platform's defaults (recorded as platform-default, config/platform_defaults.py's
# rule): on CPU vLLM would otherwise take 4 GiB of KV cache and compile for over a
# minute on two cores.
CPU_VLLM_DEFAULTS: Mapping[str, Any] = {
    "kv_cache_memory_bytes": 256 << 20,
    "enforce_eager": True,
}

_SAMPLING_RULES: Mapping[str, c.Normalizer] = {
    "temperature": c.float_normalizer(0.0, 100.0),
    "top_p": c.float_normalizer(1e-6, 1.0),
    "min_p": c.float_normalizer(0.0, 1.0),
    "max_tokens": c.int_normalizer(1),
    "min_tokens": c.int_normalizer(0),
    "seed": c.int_normalizer(0),
    "repetition_penalty": c.float_normalizer(1e-6, 100.0),
    "presence_penalty": c.float_normalizer(-2.0, 2.0),
    "frequency_penalty": c.float_normalizer(-2.0, 2.0),
}
_TOP_K = re.compile(r"-?\d+")


def sampling_value(key: str, value: Any) -> Any:
    """One ``default_sampling_params`` value, checked where vLLM's range is known."""
    if key == "n" and value != 1:
        raise ConfigError(
            f"n={value!r}: a rewrite draws one text per request",
            hint="leave n out (it is 1)",
        )
    if key == "top_k" and not (
        isinstance(value, int)
        and not isinstance(value, bool)
        and (value == -1 or value >= 0)
    ):
        raise ConfigError(
            f"top_k={value!r} is not -1, 0 or a positive integer",
            hint="use -1 or 0 (off) or k >= 1",
        )
    rule = _SAMPLING_RULES.get(key)
    return rule(value) if rule is not None else plain_data(value, key)


@dataclass(frozen=True)
class ArStageConfig:
    """An AR stage, resolved: diffserve's keys as fields, vLLM's in ``engine_args``
    (defaults included)."""

    stage_id: int
    role: str
    model: str
    engine_args: Mapping[str, Any] = field(default_factory=FrozenDict)
    default_sampling_params: Mapping[str, Any] = field(default_factory=FrozenDict)
    system_prompt: str = ""
    num_replicas: int = 1
    kv_connector: str = DEFAULT_KV_CONNECTOR
    kv_connector_extra_config: Mapping[str, Any] = field(default_factory=FrozenDict)
    timeout_s: float = 120.0
    warmup: bool = True

    @property
    def executor(self) -> str:
        """``uni``: vLLM's engine core and worker in the server's process; ``mp``: their
        own processes."""
        return str(self.engine_args.get("distributed_executor_backend", "uni"))

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.engine_args.get("tensor_parallel_size", 1))

    def describe(self) -> str:
        return f"AR stage {self.stage_id} ({self.role})"
