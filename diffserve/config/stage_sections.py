"""The sections of a stage's config (parallel layout, step cache, warmup, VAE,
conditioning cache, request defaults, attention backends): frozen dataclasses whose
field metadata is the schema (``options.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from diffserve.config import canonical as c
from diffserve.config.frozen import FrozenDict
from diffserve.config.options import opt
from diffserve.errors import ConfigError
from diffserve.registry.models import known_attention_roles

# Attention call sites that may get their own backend: declared by the model families
# (registry).
ATTENTION_ROLES: tuple[str, ...] = known_attention_roles()


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
