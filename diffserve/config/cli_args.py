"""argparse flags derived from the schema, and their translation into ``resolve()``
keywords.

One flag per leaf setting (``--dtype``, ``--tensor-parallel-size``, ``--max-queue``
...), named by the leaf's flat name, so a new schema field gets its flag without
touching this file. Every flag defaults to None ("not given"): only flags the user typed
become overrides, so a flag's default can never masquerade as an explicit choice. Values
are validated by the resolver, which names the flag.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from diffserve.config.fields import FLAT_LEAVES, Leaf
from diffserve.config.schema import PLATFORMS
from diffserve.config.structured import SINGLE_FILE_COMPONENTS
from diffserve.errors import ConfigError

_DEST_PREFIX = "config_"


def _flag(leaf: Leaf) -> str:
    return "--" + leaf.flat.replace("_", "-")


def _help(leaf: Leaf) -> str:
    default = "unset" if leaf.default is None else json.dumps(leaf.default)
    choices = f" {{{', '.join(leaf.choices)}}}" if leaf.choices else ""
    scope = "" if leaf.scope == "stage" else " (pipeline-wide)"
    return f"{leaf.doc}{choices}{scope}; default {default}"


# The flags that name one component's single file (config key `components`), and what
# each file may be.
_COMPONENT_FLAGS = {
    "transformer": "the transformer's weights from one file (diffusers, "
    "BFL or ComfyUI layout, or GGUF)",
    "vae": "the VAE's weights from one file (diffusers, BFL ae.safetensors "
    "or ComfyUI layout)",
    "text_encoder": "CLIP-L's weights from one file (clip_l.safetensors, "
    "or a ComfyUI all-in-one checkpoint)",
    "text_encoder_2": "T5-XXL's weights from one file (t5xxl_fp16.safetensors, "
    "or a ComfyUI all-in-one checkpoint)",
}


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --deploy-config, --platform, --stage-overrides and one flag per config
    field."""
    group = parser.add_argument_group(
        "config",
        "deploy config and per-field overrides "
        "(precedence: see `diffserve config explain`)",
    )
    group.add_argument(
        "--deploy-config",
        dest=f"{_DEST_PREFIX}deploy_config",
        default=None,
        metavar="YAML",
        help="deploy YAML file",
    )
    group.add_argument(
        "--platform",
        dest=f"{_DEST_PREFIX}platform",
        default=None,
        metavar="NAME",
        help=f"platform overlay to apply {{{', '.join(PLATFORMS)}}}; default: detected",
    )
    # --transformer FILE, ...: one entry of `components`.
    for component in SINGLE_FILE_COMPONENTS:
        group.add_argument(
            f"--{component.replace('_', '-')}",
            dest=f"{_DEST_PREFIX}{component}",
            default=None,
            metavar="FILE",
            help=f"{_COMPONENT_FLAGS[component]}: components: {{{component}: FILE}}",
        )
    group.add_argument(
        "--stage-overrides",
        dest=f"{_DEST_PREFIX}stage_overrides",
        default=None,
        metavar="JSON",
        help='per-stage values, e.g. \'{"0": {"linear_backend": "torch"}}\'',
    )
    for leaf in FLAT_LEAVES.values():
        dest = f"{_DEST_PREFIX}{leaf.flat}"
        if leaf.kind == "bool":
            group.add_argument(
                _flag(leaf),
                dest=dest,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=_help(leaf),
            )
        else:
            metavar = (
                "NAME"
                if leaf.choices or leaf.kind == "attention"
                else leaf.kind.upper()
            )
            group.add_argument(
                _flag(leaf), dest=dest, default=None, metavar=metavar, help=_help(leaf)
            )


def _parse_attention(text: str) -> Any:
    # A JSON object selects per-role backends: --attention-backend '{"default": "sdpa",
    # "double_block": "math"}'
    if text.strip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"--attention-backend is not valid JSON: {exc}",
                path="attention_backend",
                source="cli",
            ) from None
    return text


def config_kwargs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """``{"deploy_config", "overrides", "stage_overrides", "platform"}`` for
    ``resolve(model=..., **kw)``.

    ``overrides`` holds only the flags the user actually gave.
    """
    values = vars(args)
    overrides: dict[str, Any] = {}
    for leaf in FLAT_LEAVES.values():
        value = values.get(f"{_DEST_PREFIX}{leaf.flat}")
        if value is None:
            continue
        overrides[leaf.flat] = (
            _parse_attention(value) if leaf.kind == "attention" else value
        )
    # --transformer FILE, --vae FILE, ... join --components.
    for component in SINGLE_FILE_COMPONENTS:
        path = values.get(f"{_DEST_PREFIX}{component}")
        if path is not None:
            overrides["components"] = ",".join(
                filter(None, [overrides.get("components"), f"{component}={path}"])
            )
    stage_overrides = None
    text = values.get(f"{_DEST_PREFIX}stage_overrides")
    if text is not None:
        try:
            stage_overrides = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"--stage-overrides is not valid JSON: {exc}",
                path="stage_overrides",
                source="cli",
                hint='e.g. \'{"0": {"linear_backend": "torch"}}\'',
            ) from None
        if not isinstance(stage_overrides, dict):
            raise ConfigError(
                "--stage-overrides must be a JSON object of stage_id -> {field: value}",
                path="stage_overrides",
                source="cli",
                hint='e.g. \'{"0": {"linear_backend": "torch"}}\'',
            )
    return {
        "deploy_config": values.get(f"{_DEST_PREFIX}deploy_config"),
        "overrides": overrides,
        "stage_overrides": stage_overrides,
        "platform": values.get(f"{_DEST_PREFIX}platform"),
    }
