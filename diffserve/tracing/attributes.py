"""The span attributes diffserve sets, all under ``diffserve.`` (the HTTP span also has
the semantic-convention ``http.*``/``url.*`` ones), and how a worker's attestation
becomes attributes. Documented in docs/deploy.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.config.schema import StageConfig
    from diffserve.types.request import GenerationRequest

REQUEST_ID = "diffserve.request_id"
# the served name (server spans) or the model's directory or hub id (worker spans)
MODEL = "diffserve.model"
MODEL_FAMILY = "diffserve.model.family"
STAGE_ID = "diffserve.stage.id"
STAGE_ROLE = "diffserve.stage.role"
EXECUTOR = "diffserve.executor"  # uni | mp | ray
REPLICA = "diffserve.replica"
RANK = "diffserve.rank"
WORLD_SIZE = "diffserve.world_size"
DEVICE = "diffserve.device"
# requests in the batch this request ran (or left the queue) with
BATCH_SIZE = "diffserve.batch.size"
IMAGES = "diffserve.images"  # images of this request (n)
STEPS = "diffserve.steps"  # its num_inference_steps
STEP = "diffserve.step"  # a step event's (or step span's) 1-based step
LINEAR = "diffserve.kernel.linear"  # the Linear backends that ran (names with calls)
ATTENTION = "diffserve.kernel.attention"  # the attention backends that ran
# step cache: transformer steps computed, summed over images
CACHE_COMPUTED = "diffserve.cache.computed_steps"
CACHE_SKIPPED = "diffserve.cache.skipped_steps"  # and skipped
CONDITIONING_CACHE = "diffserve.conditioning_cache"  # hit | miss | off
LORA = "diffserve.lora.adapters"  # the LoRA adapters applied (names)
CANCELLED = "diffserve.cancelled"  # the batch stopped before this request finished
OUTPUT_FORMAT = "diffserve.output_format"
VIDEO_JOB = "diffserve.video.job_id"
PROCESS_ROLE = "diffserve.process.role"  # resource attribute: server | worker


def request_attributes(request: GenerationRequest) -> dict[str, Any]:
    attributes: dict[str, Any] = {REQUEST_ID: request.request_id, IMAGES: request.n}
    if request.num_inference_steps is not None:
        attributes[STEPS] = request.num_inference_steps
    # a file's name only (admission resolved it to a path); the attestation's names
    # replace these
    if request.loras:
        attributes[LORA] = [Path(name).name for name, _ in request.loras]
    return attributes


def worker_attributes(
    config: ResolvedConfig,
    stage: StageConfig,
    *,
    executor: str,
    replica: int,
    rank: int,
    device: Any,
) -> dict[str, Any]:
    """Where a worker runs: the same for every request it serves."""
    source = config.model_source
    model = (
        source.repo_id
        if source is not None and source.repo_id
        else Path(config.model or "").name
    )
    return {
        MODEL: model,
        MODEL_FAMILY: config.model_family or "",
        STAGE_ID: stage.stage_id,
        STAGE_ROLE: stage.role,
        EXECUTOR: executor,
        REPLICA: replica,
        RANK: rank,
        WORLD_SIZE: stage.parallel.world_size,
        DEVICE: str(device),
    }


def attestation_attributes(attestation: Mapping[str, Any]) -> dict[str, Any]:
    """What ran for one request (its attestation): kernel backends, step-cache and
    conditioning-cache decisions, LoRA adapters, the batch size."""
    attributes: dict[str, Any] = {}
    for key, name in (("linear", LINEAR), ("attention", ATTENTION)):
        calls = attestation.get(key)
        if isinstance(calls, Mapping):
            attributes[name] = sorted(
                backend for backend, count in calls.items() if count
            )
    entries = attestation.get("cache")
    if isinstance(entries, list) and entries:
        branches = [
            b for e in entries for b in (e, e.get("negative")) if isinstance(b, Mapping)
        ]
        attributes[CACHE_COMPUTED] = sum(
            int(b.get("computed_steps", 0)) for b in branches
        )
        attributes[CACHE_SKIPPED] = sum(
            int(b.get("skipped_steps", 0)) for b in branches
        )
    if attestation.get("conditioning_cache"):
        attributes[CONDITIONING_CACHE] = str(attestation["conditioning_cache"])
    lora = attestation.get("lora")
    if isinstance(lora, Mapping) and lora.get("adapters"):
        attributes[LORA] = [str(adapter.get("name")) for adapter in lora["adapters"]]
    if "batch_size" in attestation:
        attributes[BATCH_SIZE] = int(attestation["batch_size"])
    return attributes
