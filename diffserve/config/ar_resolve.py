"""AR stages, resolved: the picked values of each ``kind: ar`` stage ->
``ArStageConfig``, and the rules across its keys (roles in pairs, what vLLM cannot run
on this platform, where its model is).

The values arrive picked by the one precedence rule (``resolve.py:_pick``); vLLM
settings nobody set take diffserve's defaults (``default``) and the platform's
(``platform-default``), never posing as explicit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from diffserve.config.ar_ingest import ar_key
from diffserve.config.ar_schema import (
    AR_KEYS,
    CPU_VLLM_DEFAULTS,
    VLLM_DEFAULTS,
    ArStageConfig,
)
from diffserve.config.frozen import FrozenDict
from diffserve.config.hub import hub_cache_dir, hub_offline, parse_hub_id
from diffserve.config.provenance import DEFAULT_SOURCE, Collector, Source
from diffserve.errors import ConfigError

Picked = Mapping[str, tuple[Any, Source]]
_PLATFORM_DEFAULT = Source("platform-default")


def build_ar_stages(
    out: Collector,
    platform: str,
    pick: Callable[[int], Picked],
    provenance: dict[str, Source],
) -> tuple[ArStageConfig, ...]:
    """Every AR stage (ids 0..N-1: they run before the diffusion stages), checked;
    errors go to ``out``."""
    ids = sorted(out.ar_stage_ids)
    if ids != list(range(len(ids))):
        out.error(
            f"ar stages have stage_ids {ids}: they run first, so "
            f"they take stage_ids 0..{len(ids) - 1}",
            path="stages",
            source=None,
            hint="number the ar stages 0, 1, ... and the diffusion stages after them",
        )
        return ()
    stages = tuple(
        _build(stage_id, pick(stage_id), platform, provenance, out) for stage_id in ids
    )
    _check_pairs(stages, provenance, out)
    return stages


def _build(
    stage_id: int,
    picked: Picked,
    platform: str,
    provenance: dict[str, Source],
    out: Collector,
) -> ArStageConfig:
    own: dict[str, Any] = {}
    for key, (_, default, _) in AR_KEYS.items():
        own[key], provenance[f"stages.{stage_id}.{key}"] = picked.get(
            ar_key(key), (default, DEFAULT_SOURCE)
        )
    engine: dict[str, Any] = {}
    for key, (value, source) in picked.items():
        name = key.removeprefix("ar.")
        if name not in AR_KEYS:
            engine[name] = value
            provenance[f"stages.{stage_id}.{name}"] = source
    if own["role"] in ("prefill", "decode"):
        # The decode side's cached tokens are then the prompt tokens the connector
        # loaded (attested), no local hits.
        engine.setdefault("enable_prefix_caching", False)
        provenance.setdefault(
            f"stages.{stage_id}.enable_prefix_caching", DEFAULT_SOURCE
        )
    defaults = [(VLLM_DEFAULTS, DEFAULT_SOURCE)] + (
        [(CPU_VLLM_DEFAULTS, _PLATFORM_DEFAULT)] if platform == "cpu" else []
    )
    for table, source in defaults:
        for name, value in table.items():
            if name not in engine:
                engine[name] = value
                provenance[f"stages.{stage_id}.{name}"] = source
    model = own.pop("model")
    if model is None:
        out.error(
            f"ar stage {stage_id} names no model",
            path=f"stages.{stage_id}.model",
            source=None,
            hint="add model: <an LLM's directory or hub id>",
        )
        model = ""
    else:
        model = _locate(
            model,
            f"stages.{stage_id}.model",
            provenance[f"stages.{stage_id}.model"],
            out,
        )
    stage = ArStageConfig(
        stage_id=stage_id,
        model=model,
        engine_args=FrozenDict(sorted(engine.items())),
        **own,
    )
    _check_platform(stage, platform, provenance, out)
    return stage


def _locate(text: str, path: str, source: Source, out: Collector) -> str:
    """A directory (with a config.json), or a hub id: from the cache when offline, else
    vLLM downloads it."""
    local = Path(text).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            out.error(
                f"{local} has no config.json: not a transformers LLM folder",
                path=path,
                source=source,
                hint="point at the folder holding the LLM's config.json",
            )
        return str(local.resolve())
    parsed = parse_hub_id(text)
    if parsed is None:
        out.error(
            f"LLM directory not found: {text}",
            path=path,
            source=source,
            hint="give an existing directory (relative to the deploy "
            "file) or a hub id org/name",
        )
        return text
    if not hub_offline():
        return text  # vLLM fetches it, into its own cache
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo_id, revision = parsed
    try:
        return str(
            snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=str(hub_cache_dir()),
                local_files_only=True,
            )
        )
    except (LocalEntryNotFoundError, OSError, ValueError):
        out.error(
            f"{repo_id}@{revision} is not in the Hugging Face cache "
            f"at {hub_cache_dir()} (HF_HUB_OFFLINE=1: "
            "nothing is downloaded)",
            path=path,
            source=source,
            hint=f"`HF_HUB_OFFLINE=0 hf download {repo_id} --revision "
            f"{revision}` once online, or give the "
            "LLM's directory",
        )
        return text


def _where(stage: ArStageConfig, key: str, provenance: Mapping[str, Source]) -> str:
    return provenance.get(f"stages.{stage.stage_id}.{key}", DEFAULT_SOURCE).describe()


def _check_platform(
    stage: ArStageConfig,
    platform: str,
    provenance: Mapping[str, Source],
    out: Collector,
) -> None:
    args, sid = stage.engine_args, stage.stage_id
    if platform == "cpu" and args.get("enable_expert_parallel"):
        out.errors.append(
            ConfigError(
                "expert parallel does not run on CPU: vLLM's CPU fused-MoE "
                "kernel crashes (segfault) when the experts are "
                "split over ranks",
                path=f"stages.{sid}.enable_expert_parallel",
                source=_where(stage, "enable_expert_parallel", provenance),
                hint="set enable_expert_parallel: false (tensor_parallel_size "
                "> 1 on the mp executor splits each expert "
                "over the ranks instead)",
            )
        )
    if platform == "cpu" and stage.executor == "ray":
        out.errors.append(
            ConfigError(
                "vLLM refuses the Ray executor on CPU",
                path=f"stages.{sid}.distributed_executor_backend",
                source=_where(stage, "distributed_executor_backend", provenance),
                hint="use mp (vLLM's worker processes, tensor_parallel_size "
                "> 1 included) or uni (in the server's process)",
            )
        )
    world = int(args.get("tensor_parallel_size", 1)) * int(
        args.get("pipeline_parallel_size", 1)
    )
    if world > 1 and stage.executor == "uni":
        out.errors.append(
            ConfigError(
                f"{world} vLLM ranks need worker processes; uni runs "
                "one worker in the server's process",
                path=f"stages.{sid}.tensor_parallel_size",
                source=_where(stage, "tensor_parallel_size", provenance),
                hint="set distributed_executor_backend: mp",
            )
        )
    if stage.role == "prompt_rewrite" and stage.kv_connector_extra_config:
        out.errors.append(
            ConfigError(
                "kv_connector_extra_config configures a prefill/decode "
                "pair's KV handover",
                path=f"stages.{sid}.kv_connector_extra_config",
                source=_where(stage, "kv_connector_extra_config", provenance),
                hint="drop it, or split the stage: role: prefill then role: decode",
            )
        )


def _check_pairs(
    stages: tuple[ArStageConfig, ...], provenance: Mapping[str, Source], out: Collector
) -> None:
    """A prefill stage is followed by its decode stage (same LLM, same connector); a
    decode has its prefill."""
    for index, stage in enumerate(stages):
        after = stages[index + 1] if index + 1 < len(stages) else None
        before = stages[index - 1] if index else None
        where = _where(stage, "role", provenance)
        if stage.role == "prefill" and (after is None or after.role != "decode"):
            out.errors.append(
                ConfigError(
                    f"ar stage {stage.stage_id} (prefill) has no decode stage after it",
                    path=f"stages.{stage.stage_id}.role",
                    source=where,
                    hint=f"add stage_id: {stage.stage_id + 1}, kind: ar, role: decode, "
                    "with the same model",
                )
            )
        elif (
            stage.role == "prefill"
            and after is not None
            and (after.model, after.kv_connector) != (stage.model, stage.kv_connector)
        ):
            out.errors.append(
                ConfigError(
                    f"prefill stage {stage.stage_id} and decode stage {after.stage_id} "
                    "differ in model or kv_connector",
                    path=f"stages.{after.stage_id}.model",
                    source=_where(after, "model", provenance),
                    hint="the decode stage continues the prefill's KV: give "
                    "both the same model and kv_connector",
                )
            )
        if stage.role == "decode" and (before is None or before.role != "prefill"):
            out.errors.append(
                ConfigError(
                    f"ar stage {stage.stage_id} (decode) has no prefill "
                    "stage before it",
                    path=f"stages.{stage.stage_id}.role",
                    source=where,
                    hint="put a role: prefill stage right before it, or use "
                    "role: prompt_rewrite",
                )
            )
