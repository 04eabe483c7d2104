"""The config sources, each turned into assignments at its rank: model directory, deploy
YAML (with its base_config chain and platform overlays), environment, and caller/CLI
overrides.

Sources only read and canonicalize; the resolver alone decides which value wins.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diffserve.config.ar_ingest import ar_stage_mapping
from diffserve.config.canonical import normalize_platform
from diffserve.config.fields import FLAT_LEAVES, did_you_mean
from diffserve.config.ingest import Ctx, pipeline_doc, stage_id_of, stage_mapping
from diffserve.config.model_source import deploy_model
from diffserve.config.provenance import (
    LAYER_RANK,
    MAX_CHAIN,
    Collector,
    Source,
    StageRef,
)
from diffserve.config.schema import PLATFORMS
from diffserve.config.yaml_lines import key_line, load_yaml_file
from diffserve.errors import ConfigError
from diffserve.logging import get_logger
from diffserve.registry.example_prompts import (
    EXAMPLE_PROMPTS_KEY,
    parse_example_prompts,
)
from diffserve.registry.models import (
    MODEL_FAMILIES,
    MODEL_MARKER_FILE,
    ModelFamily,
    denoiser_components,
    read_class_name,
)
from diffserve.registry.teacache import polynomial_for

logger = get_logger(__name__)

ENV_PREFIX = "DIFFSERVE_"
# DIFFSERVE_* variables that are read elsewhere and are not config fields.
NON_CONFIG_ENV: frozenset[str] = frozenset(
    {"LOG_LEVEL", "CACHE_DIR", "API_KEY", "CPU_BF16", "CPU_KIND", "TRACE_STEPS"}
)  # tracing/settings.py
_DECK_KEYS = ("base_config", "platforms", "model")


def model_layer(
    model: str | os.PathLike | None, out: Collector
) -> tuple[str | None, ModelFamily | None]:
    """Read ``model_index.json`` (nothing heavier): the model's family and its default
    topology."""
    if model is None:
        return None, None
    if not isinstance(model, (str, os.PathLike)):
        out.error(
            f"model must be a directory path, got {type(model).__name__}",
            path="model",
            source="caller",
        )
        return None, None
    path = Path(model).expanduser()
    index = path / "model_index.json"
    if not path.is_dir():
        out.error(
            "model directory not found",
            path="model",
            source=str(path),
            hint="pass a local diffusers-format directory or a hub id, "
            "org/name[@revision]",
        )
        return str(path), None
    try:
        class_name = read_class_name(path)
    except FileNotFoundError:
        out.error(
            "not a diffusers model directory (no model_index.json)",
            path="model",
            source=str(path),
            hint="point at the directory that contains model_index.json",
        )
        return str(path.resolve()), None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        out.error(
            f"model_index.json is unreadable: {exc}", path="model", source=str(index)
        )
        return str(path.resolve()), None
    family = MODEL_FAMILIES.get(class_name)
    if family is None:
        supported = "supported text-to-image DiT pipelines: " + ", ".join(
            f"{name} ({f.implementation})" for name, f in MODEL_FAMILIES.items()
        )
        close = did_you_mean(class_name, MODEL_FAMILIES)
        out.error(
            f"unsupported pipeline class {class_name!r}",
            path="model_index.json:_class_name",
            source=str(index),
            hint=f"{close} {supported}" if close else supported,
        )
        return str(path.resolve()), None
    source = Source("model", str(index), None, class_name)
    out.add(LAYER_RANK["model"], None, "topology", family.topology, source)
    # What the family brings: which implementation serves it and its checkpoints'
    # request defaults.
    rank = LAYER_RANK["model"]
    out.add(
        rank,
        None,
        "implementation",
        family.implementation,
        Source(
            "model", str(index), None, f"{class_name}: {family.implementation} path"
        ),
    )
    out.add(
        rank,
        None,
        "quantization_ignored_layers",
        family.features.quantization_ignored_layers,
        Source("model", str(index), None, f"{class_name}: layers kept unquantized"),
    )
    _model_teacache_polynomial(path, class_name, out)
    defaults: dict[str, Any] = {
        "num_inference_steps": family.defaults.steps,
        "guidance_scale": family.defaults.guidance_scale,
    }
    if family.defaults.modality == "video":
        defaults.update(num_frames=family.defaults.num_frames, fps=family.defaults.fps)
    marker_defaults, marker_source = _marker_request_defaults(path, out)
    for key, value in defaults.items():
        if key not in marker_defaults:
            out.add(rank, None, f"request_defaults.{key}", value, source)
    # What the model declares of the family's keys, its size (no family has one: the
    # VAE's or Wan's) and its text window (a model trained on fewer tokens than its
    # family's)
    for key, value in marker_defaults.items():
        if key in defaults or key in ("height", "width", "max_sequence_length"):
            out.add(rank, None, f"request_defaults.{key}", value, marker_source)
    _check_marker_example_prompts(path, out)
    return str(path.resolve()), family


def _model_teacache_polynomial(path: Path, class_name: str, out: Collector) -> None:
    """``cache.teacache_coefficients`` from the model: the published TeaCache polynomial
    fitted on its shape, if any (``registry/teacache.py``); read from its JSON configs
    only."""
    try:
        index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
        config_file = path / "transformer" / "config.json"
        config = (
            json.loads(config_file.read_text(encoding="utf-8"))
            if config_file.is_file()
            else {}
        )
    except (OSError, ValueError):
        # an unreadable config is the loader's error to report, with its own context
        return
    experts = len(denoiser_components(index))
    fit = polynomial_for(
        class_name, config if isinstance(config, dict) else {}, experts
    )
    if fit is not None:
        out.add(
            LAYER_RANK["model"],
            None,
            "cache.teacache_coefficients",
            fit[0],
            Source("model", str(path / "model_index.json"), None, fit[1]),
        )


def _marker_request_defaults(
    path: Path, out: Collector
) -> tuple[dict[str, Any], Source]:
    """The model's own ``request_defaults`` from its marker file
    (``diffserve_model.json``), if it declares any: ``num_inference_steps``,
    ``guidance_scale``, ``height``, ``width``, ``max_sequence_length`` (and a video
    model's ``num_frames``, ``fps``), which replace the family's."""
    marker = path / MODEL_MARKER_FILE
    source = Source("model", str(marker), None, "the model's request_defaults")
    if not marker.is_file():
        return {}, source
    try:
        doc = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        out.error(
            f"{MODEL_MARKER_FILE} is unreadable: {exc}",
            path="model",
            source=str(marker),
        )
        return {}, source
    declared = doc.get("request_defaults") if isinstance(doc, dict) else None
    if declared is None:
        return {}, source
    if not isinstance(declared, dict):
        out.error(
            "request_defaults must be a mapping",
            path=f"{MODEL_MARKER_FILE}:request_defaults",
            source=str(marker),
        )
        return {}, source
    known = {
        "num_inference_steps",
        "guidance_scale",
        "num_frames",
        "fps",
        "height",
        "width",
        "max_sequence_length",
    }
    for key in sorted(set(declared) - known):
        out.error(
            f"unknown request default {key!r}",
            path=f"{MODEL_MARKER_FILE}:request_defaults.{key}",
            source=str(marker),
            hint=f"choose from: {', '.join(sorted(known))}",
        )
    return {k: v for k, v in declared.items() if k in known}, source


def _check_marker_example_prompts(path: Path, out: Collector) -> None:
    """Refuse a marker whose ``example_prompts`` is not a list of non-empty strings,
    here at resolve rather than as a blank prompt box in the playground (the server
    reads them: registry/example_prompts.py)."""
    marker = path / MODEL_MARKER_FILE
    try:
        doc = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no marker; an unreadable one is reported by _marker_request_defaults
    try:
        parse_example_prompts(doc)
    except ValueError as exc:
        out.error(
            str(exc),
            path=f"{MODEL_MARKER_FILE}:{EXAMPLE_PROMPTS_KEY}",
            source=str(marker),
            hint=f'write "{EXAMPLE_PROMPTS_KEY}": ["a prompt the model knows", ...]',
        )


def _load_chain(
    deploy_config: str | os.PathLike | Mapping, out: Collector
) -> list[tuple[str, Mapping]]:
    """The deploy file and its base_config ancestors, root ancestor first."""
    chain: list[tuple[str, Mapping]] = []
    seen: list[Path] = []
    if isinstance(
        deploy_config, Mapping
    ):  # a models: entry (model_list.DeployEntry) cites its file
        name = getattr(deploy_config, "source_name", "<dict>")
        doc, base_dir = deploy_config, getattr(deploy_config, "base_dir", Path.cwd())
    else:
        path = Path(deploy_config).expanduser().resolve()
        name, doc, base_dir = str(path), load_yaml_file(path), path.parent
        seen.append(path)
    while True:
        if doc is None:
            doc = {}  # an empty file is an empty config
        if not isinstance(doc, Mapping):
            raise ConfigError(
                f"the deploy config must be a mapping, got {type(doc).__name__}",
                source=name,
                hint="write key: value pairs at the top level",
            )
        chain.append((name, doc))
        base = doc.get("base_config")
        if base is None:
            break
        where = (
            f"{name}:{key_line(doc, 'base_config')}"
            if key_line(doc, "base_config")
            else name
        )
        if not isinstance(base, str):
            raise ConfigError(
                "base_config must be a file path", path="base_config", source=where
            )
        path = (base_dir / base).expanduser().resolve()
        if path in seen:
            cycle = " -> ".join(str(p) for p in (*seen, path))
            raise ConfigError(
                f"base_config cycle: {cycle}",
                path="base_config",
                source=where,
                hint="remove the base_config that points back",
            )
        if len(seen) >= MAX_CHAIN:
            raise ConfigError(
                f"base_config chain longer than {MAX_CHAIN} files",
                path="base_config",
                source=where,
            )
        if not path.is_file():
            raise ConfigError(
                f"base_config file not found: {path}",
                path="base_config",
                source=where,
                hint="paths are relative to the file that names them",
            )
        seen.append(path)
        name, doc, base_dir = str(path), load_yaml_file(path), path.parent
    chain.reverse()
    return chain


def deploy_layers(
    deploy_config: str | os.PathLike | Mapping | None, platform: str, out: Collector
) -> list[str]:
    """Ingest the deploy chain (yaml ranks) and each file's ``platforms.<platform>``
    (platform ranks).

    Blocks of other platforms are validated (bad keys are errors everywhere) but
    contribute nothing. Returns the files read, root ancestor first.
    """
    if deploy_config is None:
        return []
    if not isinstance(deploy_config, (str, os.PathLike, Mapping)):
        out.error(
            "deploy_config must be a YAML path or a mapping, got "
            f"{type(deploy_config).__name__}",
            path="deploy_config",
            source="caller",
        )
        return []
    try:
        chain = _load_chain(deploy_config, out)
    except ConfigError as exc:
        out.errors.append(exc)
        return []
    for position, (name, doc) in enumerate(chain):
        ctx = Ctx(out, LAYER_RANK["yaml"] + position, "yaml", name)
        if (
            "models" in doc
        ):  # a server's list of models (config/model_list.py): one config each
            out.error(
                "this file lists several models (models:), each its own deploy config",
                path="models",
                source=ctx.src(doc, "models"),
                hint="diffserve serve --deploy-config FILE serves them; "
                "to explain or validate one, give "
                "its entry a file of its own",
            )
            continue
        pipeline_doc(ctx, doc, "", reserved=_DECK_KEYS)
        if "model" in doc:
            folder = Path.cwd() if name == "<dict>" else Path(name).parent
            deploy_model(doc, name, key_line(doc, "model"), folder, out)
        blocks = doc.get("platforms")
        if blocks is None:
            continue
        if not isinstance(blocks, Mapping):
            out.error(
                "platforms must be a mapping of platform name -> overlay",
                path="platforms",
                source=ctx.src(doc, "platforms"),
                hint="write platforms: {cpu: {...}}",
            )
            continue
        seen: set[str] = set()
        for raw_name, block in blocks.items():
            block_source = Source("platform", name, key_line(blocks, raw_name))
            try:
                block_name = normalize_platform(
                    raw_name
                )  # CUDA: and hip: name the cuda / rocm blocks
            except ConfigError:
                out.error(
                    f"unknown platform {raw_name!r}",
                    path=f"platforms.{raw_name}",
                    source=block_source,
                    hint=did_you_mean(raw_name, PLATFORMS)
                    or f"known platforms: {', '.join(PLATFORMS)}",
                )
                continue
            if block_name in seen:
                out.error(
                    f"platform {block_name!r} has two blocks",
                    path=f"platforms.{raw_name}",
                    source=block_source,
                    hint="merge them into one",
                )
                continue
            seen.add(block_name)
            if block is None:
                continue
            if not isinstance(block, Mapping):
                out.error(
                    "a platform overlay must be a mapping",
                    path=f"platforms.{block_name}",
                    source=block_source,
                )
                continue
            active = block_name == platform
            # An inert block is walked into a scratch collector: its errors count, its
            # values do not.
            target = out if active else Collector()
            block_ctx = Ctx(target, LAYER_RANK["platform"] + position, "platform", name)
            pipeline_doc(block_ctx, block, f"platforms.{block_name}")
            if not active:
                out.errors.extend(target.errors)
    return [name for name, _ in chain]


def env_layer(env: Mapping[str, str], out: Collector) -> None:
    """``DIFFSERVE_<FLAT_NAME>`` variables, e.g. DIFFSERVE_LINEAR_BACKEND=torch."""
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX):
            continue
        name = var[len(ENV_PREFIX) :]
        if name in NON_CONFIG_ENV:
            continue
        flat = name.lower()
        if flat in FLAT_LEAVES:
            ctx = Ctx(out, LAYER_RANK["env"], "env", detail=var, allow_flat=True)
            pipeline_doc(ctx, {flat: env[var]}, "", stages=False)
            continue
        # Only names close to a field are typos; other DIFFSERVE_* variables may belong
        # to tools.
        hint = did_you_mean(flat, FLAT_LEAVES)
        if hint:
            suggestion = hint.split("'")[1].upper()
            out.error(
                f"unknown config variable {var}",
                path=var,
                source="env",
                hint=f"did you mean {ENV_PREFIX}{suggestion}?",
            )


def caller_layers(
    overrides: Mapping[str, Any] | None,
    stage_overrides: Mapping[Any, Any] | None,
    out: Collector,
) -> None:
    """Caller/CLI values: ``overrides`` apply to every stage, ``stage_overrides`` to one
    stage each.

    Keys are the YAML keys or the flat flag names (``tensor_parallel_size``); None means
    "not given".
    """
    if overrides is not None:
        if not isinstance(overrides, Mapping):
            out.error("overrides must be a mapping", path="overrides", source="cli")
        else:
            pipeline_doc(
                Ctx(out, LAYER_RANK["cli"], "cli", allow_flat=True),
                overrides,
                "",
                stages=False,
            )
    if stage_overrides is None:
        return
    if not isinstance(stage_overrides, Mapping):
        out.error(
            "stage_overrides must map stage_id -> {field: value}",
            path="stage_overrides",
            source="cli_stage",
            hint='e.g. {"0": {"linear_backend": "torch"}}',
        )
        return
    for raw_id, body in stage_overrides.items():
        source = Source("cli_stage", detail=f"stage_overrides[{raw_id!r}]")
        try:
            stage_id = stage_id_of(raw_id)
        except ConfigError as exc:
            out.fail(exc, path=f"stage_overrides.{raw_id}", source=source)
            continue
        if not isinstance(body, Mapping):
            out.error(
                "expected a mapping of field -> value",
                path=f"stage_overrides.{stage_id}",
                source=source,
            )
            continue
        ctx = Ctx(out, LAYER_RANK["cli_stage"], "cli_stage", allow_flat=True)
        if stage_id in out.ar_stage_ids:  # an AR stage the deploy file declared
            ar_stage_mapping(ctx, body, stage_id, f"stage_overrides.{stage_id}")
            continue
        out.stage_refs.append(StageRef(stage_id, source, f"stage_overrides.{stage_id}"))
        stage_mapping(ctx, body, stage_id, f"stage_overrides.{stage_id}")
