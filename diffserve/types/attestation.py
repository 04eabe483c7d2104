"""The attestation: what actually ran for a request, as one typed structure from the
worker to the HTTP body.

The worker builds it (``worker/worker.py``: kernel calls per backend, the layout, where
and how it ran), the pipeline adds its per-request entries (``cache``: one per image;
``lora``), the ray executor its ``node``, the engine the ``config_fingerprint``;
``RequestOutput.attestation`` and the HTTP response's ``diffserve.attestation`` carry it
unchanged. ``TypedDict`` (not a class) because it is JSON as it stands: it crosses
processes pickled and reaches clients as a JSON object whose keys are the documented API
(docs/api.md, docs/engine.md). ``total=False``: an RPC-only worker has no model keys, a
request without a step cache no ``cache``.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict

# (step 1-based, the signal compared with the threshold or None, "compute" | "skip")
CacheTraceStep = list[Any]


class BranchCacheReport(TypedDict):
    """One CFG branch of one image: how many steps its transformer computed and skipped,
    and why."""

    computed_steps: int
    skipped_steps: int
    trace: list[CacheTraceStep]


class CacheEntry(BranchCacheReport, total=False):
    """The step cache's decisions for one image (``attestation["cache"][i]``)."""

    backend: str
    threshold: float
    coefficients: str  # teacache: the published polynomial (registry/teacache.py)
    negative: BranchCacheReport  # the negative-prompt branch under true CFG


class LoraAdapterEntry(TypedDict):
    name: str  # registered name, or the path relative to lora_dir
    scale: float


class LoraReport(TypedDict):
    adapters: list[LoraAdapterEntry]


class HubModelReport(TypedDict):
    """The hub snapshot a model id resolved to (``attestation["model_source"]``; absent
    for a local folder)."""

    repo_id: str
    revision: str  # as asked: a branch, tag or commit
    commit: str  # the commit the weights were read from


class ParallelLayout(TypedDict):
    world_size: int
    cfg_parallel_size: int
    ulysses_degree: int


class KernelTally(TypedDict, total=False):
    """Calls per backend name (a ``KernelCounters.snapshot()``)."""

    linear: dict[str, int]
    attention: dict[str, int]
    transformer_forwards: int
    lora_linear_calls: int  # Linear calls that added a LoRA delta


class QuantizationReport(TypedDict):
    """How one component's Linear layers were quantized
    (``attestation["quantization"][component]``)."""

    method: str  # the config value: int8, int8_weight_only, fp8, fp8_weight_only
    # what its quantized layers' calls are counted under in ``linear`` (int8_dynamic...)
    backend: str
    quantized_linears: int
    ignored_linears: int  # left in the stage's dtype by ``quantization_ignored_layers``
    ignored_patterns: list[str]


class Attestation(KernelTally, total=False):
    parallel: ParallelLayout
    # Calls and bytes per collective (layers/collectives.py)
    collectives: dict[str, Any]
    per_rank: list[KernelTally]  # each rank's own tally, on a multi-rank layout
    executor: str
    worker_pid: int
    replica: int
    rank: int
    node: str  # the Ray node id (ray executor)
    device: str
    dtype: str
    model_family: str
    implementation: str  # "native" | "generic"
    # The image is bit-identical to its request alone (docs/engine.md)
    batch_invariant: bool
    batch_size: int
    batch_ms: float
    config_fingerprint: str
    # names, sizes and sha256 of the weight files the worker loaded (models/inspect.py)
    weights_fingerprint: str
    model_source: HubModelReport
    cache: list[CacheEntry]  # one per image
    lora: LoraReport
    # Per quantized component (transformer, text encoders)
    quantization: dict[str, QuantizationReport]
    # The exact conditioning cache (native FLUX; generic families with a
    # ``prompt_encoder``): "hit" (the text encoders did not run for this request),
    # "miss" or "off"; and the cache's entries, bytes and evictions so far after the
    # request.
    conditioning_cache: str
    conditioning_cache_state: dict[str, int]
    # A denoiser with a prefix KV cache (Qwen-Image-2.1): the batch's forwards that
    # filled it (``prefills``), read it (``hits``) and ran without it (``uncached``).
    prefix_kv_cache: dict[str, int]
    # A compiled native transformer: the kernel operators its blocks' traced graphs
    # captured (``linear``, ``diffserve.gemm_gelu_tail``,
    # ``aten._scaled_dot_product_cudnn_attention``, ...), summed over the graphs
    # traced so far (layers/traced_tally.py)
    compiled_ops: dict[str, int]
    # Staged topologies (split_text_encoder): one entry per stage the request went
    # through, in order: stage_id, role, executor, replica, worker_pid, device, dtype,
    # kernel calls (engine/encode_stage.py).
    stages: list[dict[str, Any]]
    # AR stages (kind: ar, on vLLM): one entry per AR stage the request went through, in
    # order: engine, vLLM version, worker pids, what each vLLM worker runs (dtype,
    # eager, tensor parallel, attention backend, MoE experts class, KV blocks, read in
    # the worker: ar/probe.py), the KV handover, tokens in and out (engine/ar_stage.py).
    ar: list[dict[str, Any]]
    # the VAE decoded this image in tiles (the stage's vae section;
    # models/vae_tiling.py)
    vae_tiled: bool
    # Wan (models/wan/experts.py): the expert that ran each denoise step and each
    # expert's forward calls.
    experts: dict[str, Any]
