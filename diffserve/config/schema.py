"""The typed, frozen config objects. Their field metadata is the single schema
declaration.

Validation at ingress, CLI flags, environment variable names, JSON Schema and the docs
tables are all derived from ``dataclasses.fields()`` of these classes (see
``fields.py``), so no setting is ever written down twice. Everything here is a plain
frozen dataclass so a ``ResolvedConfig`` pickles cleanly into worker processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diffserve.config import canonical as c
from diffserve.config import structured as sv
from diffserve.config.frozen import FrozenDict
from diffserve.config.options import opt, section
from diffserve.config.stage_sections import (
    AttentionBackendConfig,
    CacheConfig,
    ConditioningCacheConfig,
    ParallelConfig,
    RequestDefaultsConfig,
    VaeConfig,
    WarmupConfig,
)

# Topology name -> role of each stage, by stage_id.
TOPOLOGIES: Mapping[str, tuple[str, ...]] = {
    "single": ("diffusion",),
    "split_text_encoder": ("text_encoder", "diffusion"),
    "encode_denoise_decode": ("text_encoder", "diffusion", "decoder"),
}
PLATFORMS: tuple[str, ...] = c.canonical_values(c.PLATFORM_ALIASES)


@dataclass(frozen=True)
class StageConfig:
    """Complete, resolved settings of one stage. ``stage_id`` and ``role`` come from the
    topology."""

    stage_id: int = 0
    role: str = "diffusion"
    dtype: str = opt(
        "auto",
        "weights/activation dtype; unset = the platform's default "
        "(bfloat16 on GPUs and on "
        "CPUs with AVX512-BF16/AMX, else float32); auto = the same rule in the worker",
        c.normalize_dtype,
        choices=c.canonical_values(c.DTYPE_ALIASES),
    )
    linear_backend: str = opt(
        "auto",
        "kernel backend of every Linear layer",
        c.normalize_linear_backend,
        choices=c.canonical_values(c.LINEAR_BACKEND_ALIASES),
    )
    attention_backend: AttentionBackendConfig = field(
        default_factory=AttentionBackendConfig,
        metadata={
            "doc": "attention kernel: a name, or {default: NAME, <role>: "
            "NAME} per role",
            "normalize": c.normalize_attention_backend,
            "kind": "attention",
            "choices": c.canonical_values(c.ATTENTION_BACKEND_ALIASES),
        },
    )
    enforce_eager: bool = opt(
        False,
        "never compile; run eager PyTorch (unset: true on CPU, false elsewhere)",
        c.normalize_bool,
        kind="bool",
    )
    cuda_graphs: bool = opt(
        False,
        "compiled blocks replay CUDA graphs, one per (shape, batch): less launch "
        "overhead, more GPU memory (needs enforce_eager: false on a CUDA GPU)",
        c.normalize_bool,
        kind="bool",
    )
    distributed_executor_backend: str = opt(
        "uni",
        "uni = worker in this process, mp = worker processes (one per rank)",
        c.normalize_executor,
        choices=c.canonical_values(c.EXECUTOR_ALIASES),
    )
    num_replicas: int = opt(
        1, "independent copies of this stage", c.int_normalizer(1), kind="int"
    )
    devices: tuple[int, ...] = opt(
        (),
        'device indices: a list ([0, 1]) or "0,1"; empty or auto = pick',
        sv.normalize_devices,
        kind="list",
    )
    max_batch_size: int = opt(
        1, "most requests batched into one forward", c.int_normalizer(1), kind="int"
    )
    max_step_tokens: int = opt(
        0,
        "most latent tokens one batch runs per denoising step (images x tokens per "
        "image x latent frames, summed over its requests); the scheduler fills a "
        "batch and its step-level joins up to it, and a request above it runs alone; "
        "0 = auto: max_batch_size x the tokens of one default request of the model",
        c.int_normalizer(0),
        kind="int",
    )
    implementation: str = opt(
        "native",
        "native = diffserve's own denoiser; generic = diffusers' pipeline class "
        "with its Linear and attention calls on our kernels "
        "(unset: the model's, from the "
        "registry; generic may be forced on a native family)",
        c.normalize_implementation,
        choices=c.canonical_values(c.IMPLEMENTATION_ALIASES),
    )
    batching: str = opt(
        "step",
        "step = requests of one step key join a running batch at a step boundary and "
        "leave when done; request = a batch of one batch key runs start to end as "
        "formed",
        c.normalize_batching,
        choices=c.canonical_values(c.BATCHING_ALIASES),
    )
    batch_invariant: bool = opt(
        True,
        "every image of a batch bit-identical to its request alone: each sample "
        "through its own GEMM and attention calls (false: whole-batch calls, faster "
        "where batching makes an image cheaper, last bits may differ)",
        c.normalize_bool,
        kind="bool",
    )
    quantization: str = opt(
        "none",
        "weights of the denoiser's Linear layers: none, int8 (W8A8: int8 weights, "
        "activations quantized per token), int8_weight_only, "
        "fp8 (W8A8 float8: CUDA compute "
        "capability >= 8.9), fp8_weight_only; torchao (the "
        "quant extra), docs/quantization.md",
        c.normalize_quantization,
        choices=c.canonical_values(c.QUANTIZATION_ALIASES),
    )
    quantization_ignored_layers: tuple[str, ...] = opt(
        (),
        "denoiser modules left unquantized: module-name patterns "
        "with * and ? (a list, or comma-separated; "
        "a name also covers the modules under it); unset = "
        "the model family's (embedders, modulation, "
        "final layer)",
        sv.normalize_module_patterns,
        kind="list",
    )
    text_encoder_quantization: str = opt(
        "none",
        "weights of the text encoders' Linear layers, the same methods as quantization",
        c.normalize_quantization,
        choices=c.canonical_values(c.QUANTIZATION_ALIASES),
    )
    offload: str = opt(
        "none",
        "accelerators only: none; model = the text encoders "
        "and the VAE leave the device "
        "while the denoiser runs (and back); sequential = the "
        "denoiser's blocks too, one at a time "
        "with the next prefetched",
        c.normalize_offload,
        choices=c.canonical_values(c.OFFLOAD_ALIASES),
    )
    parallel: ParallelConfig = section(ParallelConfig, "parallelism degrees", "")
    cache: CacheConfig = section(CacheConfig, "step cache", "cache_")
    warmup: WarmupConfig = section(WarmupConfig, "warmup run at startup", "warmup_")
    vae: VaeConfig = section(VaeConfig, "VAE decode: tiling", "vae_")
    conditioning_cache: ConditioningCacheConfig = section(
        ConditioningCacheConfig,
        "repeated prompts skip the text encoders",
        "conditioning_cache_",
    )
    request_defaults: RequestDefaultsConfig = section(
        RequestDefaultsConfig, "values of unset request fields", "default_"
    )
    lora_modules: Mapping[str, str] = opt(
        FrozenDict(),
        "LoRA adapters registered at start: {name: path} (flags "
        "and environment: name=path,...); requests choose them by name",
        sv.normalize_lora_modules,
        kind="mapping",
    )
    components: Mapping[str, str] = opt(
        FrozenDict(),
        "components whose weights come from a single file instead of "
        "the model's folder: {transformer: path, vae: path, text_encoder: path, "
        "text_encoder_2: path} (flags: --transformer FILE, --vae FILE, "
        "--text-encoder FILE, --text-encoder-2 FILE); diffusers, BFL and ComfyUI "
        "layouts",
        sv.normalize_components,
        kind="mapping",
    )
    lora_dir: str = opt(
        "",
        "directory requests may load LoRA files from by path "
        "(empty: only registered names)",
        sv.normalize_optional_dir,
    )
    max_loras: int = opt(
        4,
        "LoRA adapters kept in memory (LRU); also the most one request may combine",
        c.int_normalizer(1),
        kind="int",
    )
    max_lora_rank: int = opt(
        64, "largest LoRA rank accepted per layer", c.int_normalizer(1), kind="int"
    )
    max_lora_scale: float = opt(
        4.0,
        "largest |scale| a request may give an adapter (HTTP 400 above)",
        c.float_normalizer(0.0, 100.0),
        kind="float",
    )
    worker_extension_cls: str | None = opt(
        None,
        "dotted path of a WorkerExtension subclass to load",
        sv.normalize_class_path,
    )
    extras: Mapping[str, Any] = field(
        default_factory=FrozenDict,
        metadata={
            "doc": "model-specific keys; the only free-form bag",
            "kind": "extras",
        },
    )


# Stage fields that are identity, never settable from a source.
DERIVED_STAGE_FIELDS: tuple[str, ...] = ("stage_id", "role")
