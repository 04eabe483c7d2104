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
from diffserve.config.frozen import FrozenDict
from diffserve.errors import ConfigError
from diffserve.registry.models import known_attention_roles

# Topology name -> role of each stage, by stage_id.
TOPOLOGIES: Mapping[str, tuple[str, ...]] = {
    "single": ("diffusion",),
    "split_text_encoder": ("text_encoder", "diffusion"),
    "encode_denoise_decode": ("text_encoder", "diffusion", "decoder"),
}
PLATFORMS: tuple[str, ...] = c.canonical_values(c.PLATFORM_ALIASES)
# Attention call sites that may get their own backend: declared by the model families
# (registry).
ATTENTION_ROLES: tuple[str, ...] = known_attention_roles()


def opt(
    default: Any, doc: str, normalize: c.Normalizer, *, kind: str = "str", **extra: Any
) -> Any:
    """Declare one setting: its default, help text, ingress normalizer and JSON type."""
    meta = {"doc": doc, "normalize": normalize, "kind": kind, **extra}
    return field(default=default, metadata=meta)


def section(cls: type, doc: str, flat_prefix: str) -> Any:
    """Declare a nested section; ``flat_prefix`` + leaf name is its CLI flag / env
    variable name."""
    return field(
        default_factory=cls,
        metadata={"doc": doc, "section": cls, "flat_prefix": flat_prefix},
    )


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = opt(
        1, "tensor-parallel degree of the transformer", c.int_normalizer(1), kind="int"
    )
    cfg_parallel_size: int = opt(
        1, "ranks splitting the CFG branches (1 or 2)", c.int_normalizer(1), kind="int"
    )
    ulysses_degree: int = opt(
        1, "Ulysses sequence-parallel degree", c.int_normalizer(1), kind="int"
    )
    ring_degree: int = opt(
        1, "ring-attention sequence-parallel degree", c.int_normalizer(1), kind="int"
    )

    @property
    def world_size(self) -> int:
        return (
            self.tensor_parallel_size
            * self.cfg_parallel_size
            * self.ulysses_degree
            * self.ring_degree
        )


@dataclass(frozen=True)
class CacheConfig:
    """Step cache (docs/cache.md). For every backend a higher threshold skips more
    steps."""

    backend: str = opt(
        "none",
        "step cache: none, fbcache (First-Block Cache) or teacache",
        c.normalize_cache_backend,
        choices=c.canonical_values(c.CACHE_BACKEND_ALIASES),
    )
    # None until resolved: the backend's published default (registry/caches.py),
    # recorded as a default.
    threshold: float | None = opt(
        None,
        "skip a step while its signal is below this (higher = more skipping); "
        "unset = the backend's default; a request may ask for its own",
        c.float_normalizer(0.0, 100.0),
        kind="float",
    )
    max_threshold: float = opt(
        1.0,
        "largest cache_threshold a request may ask for (HTTP 400 above it)",
        c.float_normalizer(0.0, 100.0),
        kind="float",
    )
    warmup_steps: int = opt(
        1,
        "first denoise steps always computed (at least 1: nothing is cached before)",
        c.int_normalizer(1),
        kind="int",
    )
    max_consecutive_skips: int = opt(
        0,
        "most steps skipped in a row before one is computed; 0 = no limit",
        c.int_normalizer(0),
        kind="int",
    )
    teacache_coefficients: str = opt(
        "auto",
        "TeaCache's published rescaling polynomial: auto (the model's own fit; "
        "a model without one refuses teacache) or a name to apply it anyway",
        c.normalize_teacache_polynomial,
        choices=c.canonical_values(c.TEACACHE_ALIASES),
    )

    @property
    def request_threshold(self) -> float:
        """The ``cache_threshold`` of a request that names none: the resolved
        ``threshold`` (0: uncached)."""
        return float(self.threshold or 0.0) if self.backend != "none" else 0.0


@dataclass(frozen=True)
class WarmupConfig:
    enabled: bool = opt(
        False,
        "run one tiny generation before reporting ready",
        c.normalize_bool,
        kind="bool",
    )
    height: int = opt(
        128,
        "warmup image height (multiple of 16)",
        c.int_normalizer(16, 16),
        kind="int",
    )
    width: int = opt(
        128, "warmup image width (multiple of 16)", c.int_normalizer(16, 16), kind="int"
    )
    steps: int = opt(1, "warmup denoise steps", c.int_normalizer(1), kind="int")


@dataclass(frozen=True)
class VaeConfig:
    """How latents become pixels (docs/models.md, "VAE tiling"). Decoding is always one
    image at a time (batch invariance), which is what diffusers calls slicing."""

    tiling: str = opt(
        "auto",
        "decode in overlapping tiles, blended at the seams: "
        "auto = for images of at least "
        "tiling_min_pixels, on = always (when larger than one tile), off = never",
        c.normalize_vae_tiling,
        choices=c.canonical_values(c.VAE_TILING_ALIASES),
    )
    tiling_min_pixels: int = opt(
        1024 * 1024,
        "with tiling auto: tile images of at least this many pixels (height x width)",
        c.int_normalizer(1),
        kind="int",
    )
    tile_size: int = opt(
        512,
        "tile side in pixels (a multiple of 64); neighbouring "
        "tiles overlap by a quarter",
        c.int_normalizer(64, 64),
        kind="int",
    )


@dataclass(frozen=True)
class ConditioningCacheConfig:
    """The exact conditioning cache (docs/engine.md, "Conditioning cache"): a repeated
    prompt's text-encoder outputs are reused. The default holds 64 prompts at FLUX.1's
    full 512-token T5 window in bfloat16 (4 MiB each), more at shorter windows: a few
    percent of a GPU's memory for a text encoder's whole cost."""

    max_bytes: int = opt(
        256 * 2**20,
        "most bytes of encoder outputs kept (least recently used go first)",
        c.int_normalizer(0),
        kind="int",
    )
    max_entries: int = opt(
        1024, "most texts kept; 0 turns the cache off", c.int_normalizer(0), kind="int"
    )


@dataclass(frozen=True)
class RequestDefaultsConfig:
    """What a request that leaves a field unset gets. The model brings its checkpoints'
    defaults (source ``model``: FLUX 28 steps at guidance 3.5, SD3 28 at CFG 7.0,
    PixArt-Sigma 20 at 4.5); a deploy file or flag may set others."""

    num_inference_steps: int | None = opt(
        None,
        "denoise steps of a request that sends none (unset: the model's)",
        c.int_normalizer(1),
        kind="int",
    )
    guidance_scale: float | None = opt(
        None,
        "guidance_scale of a request that sends none (unset: the model's; "
        "the distilled guidance of FLUX, the CFG scale of SD3 and PixArt)",
        c.float_normalizer(0.0, 100.0),
        kind="float",
    )
    max_sequence_length: int | None = opt(
        None,
        "text tokens a request that sends none is encoded to (unset: the "
        "model's window, e.g. FLUX 512, SD3 256); at most the model's window",
        c.int_normalizer(1),
        kind="int",
    )
    num_frames: int | None = opt(
        None,
        "frames of a video request that sends none (video models only; unset: the "
        "model's, e.g. Wan's 81)",
        c.int_normalizer(1),
        kind="int",
    )
    fps: int | None = opt(
        None,
        "frame rate of a video request that sends none (video models only; unset: the "
        "model's, e.g. Wan's 16)",
        c.int_normalizer(1),
        kind="int",
    )
    height: int | None = opt(
        None,
        "height of a request that sends no size (unset: the model's, e.g. the VAE's "
        "sample size for FLUX, Wan's 480)",
        c.int_normalizer(1),
        kind="int",
    )
    width: int | None = opt(
        None,
        "width of a request that sends no size (unset: the model's, e.g. Wan's 832)",
        c.int_normalizer(1),
        kind="int",
    )


@dataclass(frozen=True)
class AttentionBackendConfig:
    """``default`` applies to every attention role not listed in ``roles``."""

    default: str = "auto"
    roles: Mapping[str, str] = field(default_factory=FrozenDict)

    def for_role(self, role: str) -> str:
        if role not in ATTENTION_ROLES:
            raise ConfigError(
                "unknown attention role "
                f"{role!r}; known roles: "
                f"{', '.join(ATTENTION_ROLES)}"
            )
        return self.roles.get(role, self.default)


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
        c.normalize_devices,
        kind="list",
    )
    max_batch_size: int = opt(
        1, "most requests batched into one forward", c.int_normalizer(1), kind="int"
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
        "step = requests of one batch key join a running batch at a step boundary and "
        "leave when done; request = a batch runs start to end as formed",
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
        c.normalize_module_patterns,
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
        c.normalize_lora_modules,
        kind="mapping",
    )
    components: Mapping[str, str] = opt(
        FrozenDict(),
        "components whose weights come from a single file instead of "
        "the model's folder: {transformer: path, vae: path, text_encoder: path, "
        "text_encoder_2: path} (flags: --transformer FILE, --vae FILE, "
        "--text-encoder FILE, --text-encoder-2 FILE); diffusers, BFL and ComfyUI "
        "layouts",
        c.normalize_components,
        kind="mapping",
    )
    lora_dir: str = opt(
        "",
        "directory requests may load LoRA files from by path "
        "(empty: only registered names)",
        c.normalize_optional_dir,
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
        c.normalize_class_path,
    )
    extras: Mapping[str, Any] = field(
        default_factory=FrozenDict,
        metadata={
            "doc": "model-specific keys; the only free-form bag",
            "kind": "extras",
        },
    )


@dataclass(frozen=True)
class AutoscalingConfig:
    """Replicas of the Ray Serve front (``diffserve serve --ray-serve``,
    ``diffserve.ray_serve:app``; docs/deploy.md, "Ray Serve"): each replica is a whole
    diffserve engine, and Ray Serve adds or removes replicas to keep the requests in
    flight or queued per replica near ``target_ongoing_requests``. Each key is Ray
    Serve's autoscaling key of the same name. A server without Ray Serve is one process
    with one engine and does not read this section."""

    min_replicas: int = opt(
        1,
        "fewest Ray Serve replicas, each a whole engine (at "
        "least 1: a replica loads its model "
        "before it takes traffic)",
        c.int_normalizer(1),
        kind="int",
    )
    max_replicas: int = opt(
        1,
        "most Ray Serve replicas (at least min_replicas)",
        c.int_normalizer(1),
        kind="int",
    )
    target_ongoing_requests: int = opt(
        2,
        "requests in flight or queued per replica that Ray Serve scales to keep",
        c.int_normalizer(1),
        kind="int",
    )
    upscale_delay_s: float = opt(
        30.0,
        "seconds the load must ask for more replicas before one is added",
        c.float_normalizer(0.0, 86400.0),
        kind="float",
    )
    downscale_delay_s: float = opt(
        600.0,
        "seconds the load must ask for fewer replicas before one is removed",
        c.float_normalizer(0.0, 86400.0),
        kind="float",
    )
    metrics_interval_s: float = opt(
        10.0,
        "seconds between the request-count reports the scaling decisions read",
        c.float_normalizer(0.1, 3600.0),
        kind="float",
    )
    look_back_period_s: float = opt(
        30.0,
        "seconds of reports averaged into one decision (more than metrics_interval_s)",
        c.float_normalizer(0.1, 86400.0),
        kind="float",
    )


@dataclass(frozen=True)
class ServerConfig:
    """Pipeline-wide request limits (never per stage)."""

    max_n: int = opt(4, "most images per request", c.int_normalizer(1), kind="int")
    max_pixels: int = opt(
        1048576,
        "most pixels (height*width) per image",
        c.int_normalizer(256),
        kind="int",
    )
    max_steps: int = opt(
        100, "most denoise steps per request", c.int_normalizer(1), kind="int"
    )
    max_queue: int = opt(
        64,
        "most requests waiting; beyond it requests are rejected (HTTP 429)",
        c.int_normalizer(1),
        kind="int",
    )
    max_body_bytes: int = opt(
        1048576,
        "largest HTTP request body accepted",
        c.int_normalizer(1024),
        kind="int",
    )
    max_upload_bytes: int = opt(
        20971520,
        "largest multipart body of POST /v1/images/edits (images, mask and "
        "fields together; HTTP 413 above)",
        c.int_normalizer(1024),
        kind="int",
    )
    max_prompt_chars: int = opt(
        4000,
        "longest prompt, negative_prompt or user string in characters (HTTP 422)",
        c.int_normalizer(1),
        kind="int",
    )
    batch_deadline_floor_s: int = opt(
        120,
        "seconds any batch may run before its worker counts as hung",
        c.int_normalizer(1),
        kind="int",
    )
    batch_deadline_s_per_mpix_step: float = opt(
        30.0,
        "seconds added to the floor per megapixel x denoise step x image of a batch",
        c.float_normalizer(0.0, 1e6),
        kind="float",
    )
    max_consecutive_failures: int = opt(
        3,
        "failed batches in a row that mark the engine dead (/health 503)",
        c.int_normalizer(1),
        kind="int",
    )
    max_connections: int = opt(
        64,
        "concurrent HTTP connections; more are answered 503 and closed",
        c.int_normalizer(1),
        kind="int",
    )
    body_timeout_s: int = opt(
        10,
        "seconds a client may take to send its request body (HTTP 408 after)",
        c.int_normalizer(1),
        kind="int",
    )
    allowed_hosts: tuple[str, ...] = opt(
        (),
        "Host header values accepted: a list or comma-separated (empty: "
        "any); against DNS rebinding",
        c.normalize_host_list,
        kind="list",
    )
    expose_config: bool = opt(
        False,
        "/v1/config shows absolute paths and extras values (off: redacted)",
        c.normalize_bool,
        kind="bool",
    )
    # The video job API (docs/api.md#videos): where jobs and their files live, and how
    # long.
    state_dir: str = opt(
        "",
        "directory of the server's own state: the embedded "
        "SQLite job store and, unless "
        "artifact_dir is set, the video files (empty: $XDG_STATE_HOME/diffserve, else "
        "~/.local/state/diffserve)",
        c.normalize_optional_dir,
    )
    job_store: str = opt(
        "",
        "database of video jobs: sqlite:///PATH or postgresql://USER@HOST:PORT/DB, "
        "shared by "
        "every instance that serves the same jobs (empty: SQLite in state_dir)",
        c.normalize_job_store_url,
    )
    artifact_dir: str = opt(
        "",
        "directory of finished videos (MP4, thumbnail, sprite sheet), shared by every "
        "instance of one job store (empty: state_dir/videos)",
        c.normalize_optional_dir,
    )
    video_ttl_s: int = opt(
        86400,
        "seconds a finished video job and its files are kept (0: forever)",
        c.int_normalizer(0),
        kind="int",
    )
    job_lease_s: int = opt(
        30,
        "seconds a video job's lease lasts without a heartbeat; a job whose instance "
        "died is failed or requeued after it",
        c.int_normalizer(2),
        kind="int",
    )
    job_deadline_s: int = opt(
        3600,
        "seconds a video job may run (queue wait on its instance included) before it "
        "fails with deadline_exceeded",
        c.int_normalizer(1),
        kind="int",
    )
    requeue_interrupted: bool = opt(
        False,
        "run a video job interrupted by a restart or a dead instance again "
        "from the start (off: it fails with server_restart)",
        c.normalize_bool,
        kind="bool",
    )
    autoscaling: AutoscalingConfig = section(
        AutoscalingConfig, "Ray Serve replicas (--ray-serve only)", "autoscaling_"
    )


# Stage fields that are identity, never settable from a source.
DERIVED_STAGE_FIELDS: tuple[str, ...] = ("stage_id", "role")
