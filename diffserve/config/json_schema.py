"""JSON Schema (draft 2020-12) of the deploy YAML, generated from the schema
dataclasses.

Enums list canonical spellings only; aliases (``bf16``, ``TORCH``) are accepted by the
resolver and named in each description.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diffserve.config.ar_schema import AR_KEYS, AR_ROLES
from diffserve.config.fields import (
    SECTIONS,
    STAGE_KEYS,
    STAGE_LEAVES,
    TOP_LEVEL_PIPELINE_LEAVES,
    Leaf,
)
from diffserve.config.schema import PLATFORMS
from diffserve.config.stage_sections import ATTENTION_ROLES

# list and mapping settings also take their flag/environment spelling ("a,b",
# "name=path,...").
_JSON_TYPES: dict[str, Any] = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "list": ["array", "string"],
    "mapping": ["object", "string"],
}


def _aliases(leaf: Leaf) -> str:
    table = getattr(leaf.normalize, "aliases", None)
    if not table:
        return ""
    extra = sorted(k for k, v in table.items() if k != v)
    return f" Aliases: {', '.join(extra)}." if extra else ""


def _leaf_schema(leaf: Leaf) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "description": f"{leaf.doc}.{_aliases(leaf)}",
        "default": leaf.default,
    }
    if leaf.choices:
        schema["enum"] = list(leaf.choices)
    elif leaf.key == "devices":
        schema["type"] = ["array", "string", "integer"]
    elif leaf.default is None:
        schema["type"] = ["string", "null"]
    else:
        schema["type"] = _JSON_TYPES[leaf.kind]
    minimum = getattr(leaf.normalize, "minimum", None)
    if minimum is not None:
        schema["minimum"] = minimum
    maximum = getattr(leaf.normalize, "maximum", None)
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def _section_schema(name: str) -> dict[str, Any]:
    return _object_schema(SECTIONS[name])


def _object_schema(leaves: Mapping[str, Leaf]) -> dict[str, Any]:
    """A section's object; leaves keyed ``inner.key`` make a nested object
    (``server.autoscaling``)."""
    props: dict[str, Any] = {}
    for key, leaf in leaves.items():
        if "." not in key:
            props[key] = _leaf_schema(leaf)
        else:
            inner = key.split(".", 1)[0]
            props.setdefault(
                inner,
                _object_schema(
                    {
                        k.split(".", 1)[1]: v
                        for k, v in leaves.items()
                        if k.startswith(f"{inner}.")
                    }
                ),
            )
    return {"type": "object", "additionalProperties": False, "properties": props}


def _stage_properties() -> dict[str, Any]:
    props: dict[str, Any] = {}
    for key in STAGE_KEYS:
        if key in SECTIONS:
            props[key] = _section_schema(key)
        elif key == "extras":
            props[key] = {
                "type": "object",
                "description": "model-specific keys; the only free-form bag",
            }
        elif key == "attention_backend":
            name = _leaf_schema(STAGE_LEAVES[key])
            props[key] = {
                "description": name.pop("description"),
                "default": "auto",
                "oneOf": [
                    {"enum": name["enum"]},
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            role: {"enum": name["enum"]}
                            for role in ("default", *ATTENTION_ROLES)
                        },
                    },
                ],
            }
        else:
            props[key] = _leaf_schema(STAGE_LEAVES[key])
    return props


def deploy_json_schema() -> dict[str, Any]:
    """The JSON Schema of a deploy YAML file."""
    diffusion_entry = {
        "type": "object",
        "additionalProperties": False,
        "required": ["stage_id"],
        "properties": {
            "stage_id": {"type": "integer", "minimum": 0},
            "kind": {"const": "diffusion"},
            **_stage_properties(),
        },
    }
    stage_entry = {"anyOf": [diffusion_entry, _ar_entry()]}
    overlay_props = {
        **{key: _leaf_schema(leaf) for key, leaf in TOP_LEVEL_PIPELINE_LEAVES.items()},
        "server": _section_schema("server"),
        "stages": {"type": "array", "items": stage_entry},
        **_stage_properties(),
    }
    overlay = {
        "type": "object",
        "additionalProperties": False,
        "properties": overlay_props,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "diffserve deploy config",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "base_config": {
                "type": "string",
                "description": "parent YAML, relative to this file",
            },
            "model": {
                "type": "string",
                "description": "the model: a diffusers directory (relative to this "
                "file) "
                "or a hub id org/name[@revision]; the caller's MODEL wins",
            },
            **overlay_props,
            "platforms": {
                "type": "object",
                "additionalProperties": False,
                "properties": {name: overlay for name in PLATFORMS},
            },
        },
    }


def _ar_entry() -> dict[str, Any]:
    """An AR stage's entry (``kind: ar``): diffserve's keys typed; vLLM's EngineArgs
    fields are the other keys, checked by name against the installed vLLM at resolve
    (``config validate``), so the schema lets them through. An overlay of an AR stage
    that a schema-checking editor validates repeats ``kind: ar``."""
    own: dict[str, dict[str, Any]] = {
        "stage_id": {"type": "integer", "minimum": 0},
        "kind": {"const": "ar"},
        "role": {"enum": list(AR_ROLES)},
        "model": {"type": "string"},
        "system_prompt": {"type": "string"},
        "default_sampling_params": {"type": "object"},
        "num_replicas": {"type": "integer", "minimum": 1},
        "kv_connector": {"type": "string"},
        "kv_connector_extra_config": {"type": "object"},
        "timeout_s": {"type": "number", "minimum": 1},
        "warmup": {"type": "boolean"},
    }
    for key, (_, _, doc) in AR_KEYS.items():
        own[key] = {**own[key], "description": doc}
    return {
        "type": "object",
        "required": ["stage_id", "kind"],
        "properties": own,
        "additionalProperties": True,
        "description": "an AR stage (an LLM on vLLM): these keys, plus any "
        "vllm.EngineArgs field",
    }
