"""The request and output envelopes shared by the engine, the executors, the worker and
the pipeline.

A ``GenerationRequest`` validates its own fields when it is built, so one that exists is
well formed; the deployment's limits and the model's capabilities are checked once more,
at admission (``engine/admission.py``), because only the engine knows them."""

from __future__ import annotations

import math
import secrets
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from diffserve.errors import RequestError
from diffserve.types.attestation import Attestation

OutputType = Literal["pil", "latent", "pt"]
MAX_SEED = 2**63 - 1
# Upper bounds of the float knobs: far above any useful value, and a bound keeps a typo
# (or 1e308) from reaching the sampler as an overflow.
MAX_GUIDANCE_SCALE = 100.0
MAX_TRUE_CFG_SCALE = 100.0
MAX_CACHE_THRESHOLD = (
    100.0  # the config's bound too; a deployment sets a tighter cache.max_threshold
)
MAX_FRAMES = (
    10_000  # a sanity bound; a deployment's server.max_frames is the real limit
)
MAX_FPS = 240


@dataclass(frozen=True)
class Carried:
    """What the engine adds to a request between the client and the pipeline, apart from
    what the client asked (as vLLM keeps its ``Request`` apart from the client's
    ``SamplingParams``)."""

    # Warmup requests run through the normal path but are excluded from counters and
    # metrics.
    is_warmup: bool = False
    # A stored job's request, admitted (``engine/admission.py``) when the job was
    # created: the engine runs it without a second admission
    # (``entrypoints/jobs/job_request.py``).
    admitted: bool = False
    # Set by the engine between stages (staged topologies): the previous stage's output
    # for this one (the family's own connector payload, e.g. the text encoders' states
    # for the denoising stage).
    stage_input: Any = None
    # Set by the engine when tracing is on (tracing/spans.py:carry): the W3C trace
    # context (``traceparent``, ``tracestate``) as (key, value) pairs, travelling with
    # the request to its workers, whose spans join the request's trace; empty: not
    # traced.
    trace_context: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One text-to-image request. ``n`` images share the prompt; image ``i`` uses seed
    ``seed + i``.

    ``height``/``width`` of ``None`` mean the model's default sample size.
    ``num_inference_steps`` and ``guidance_scale`` of ``None`` take the deployment's
    ``request_defaults`` (the model's own defaults unless the deploy file sets others)
    at admission. A ``seed`` of ``None`` is replaced by a random one at admission and
    reported in the output, so every image is reproducible.
    """

    prompt: str
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    true_cfg_scale: float = 1.0
    seed: int | None = None
    n: int = 1
    max_sequence_length: int | None = (
        None  # None: the model's limit (FLUX 512, SD3 256, PixArt-Sigma 300)
    )
    output_type: OutputType = "pil"
    # Step-cache threshold for this request (higher = more steps skipped; 0 = no
    # caching); None = the stage's ``cache.threshold``. Bounded by the stage's
    # ``cache.max_threshold`` at admission.
    cache_threshold: float | None = None
    # LoRA adapters and their scales: a registered name, or a file path inside the
    # deployment's lora_dir. Empty: the base model. Admission checks them against the
    # deployment and sorts them by name.
    loras: tuple[tuple[str, float], ...] = ()
    # Image edits. ``images``: input images, uint8 numpy arrays [H, W, 3] (RGB); the
    # first is the image to edit (img2img / inpainting), or the reference of a model
    # that takes references (FLUX.1 Kontext). ``mask``: uint8 [H, W] of the first
    # image's size, 255 = repaint, 0 = keep (diffusers' convention; the HTTP layer
    # converts OpenAI's transparent-means-edit mask). ``strength``: the fraction of the
    # noise schedule that runs, from the image noised to that level (1.0 = from pure
    # noise); None = 0.6 at admission (diffusers' default) for img2img and inpainting;
    # unused by reference models.
    images: tuple[Any, ...] = ()
    mask: Any = None
    strength: float | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # False: this request's texts are encoded afresh and not stored in the conditioning
    # cache.
    conditioning_cache: bool = True
    # AR stages (a deploy file's kind: ar stages): None = rewrite the prompt when the
    # deployment has such a stage; False = skip them (the prompt goes to the diffusion
    # stages as written); True = require one (400 without).
    rewrite_prompt: bool | None = None
    # Video models: frames per video (the model's ``k * temporal_factor + 1``; None: the
    # deployment's default) and the frame rate written into the video (None: the
    # deployment's default). Image models refuse both.
    num_frames: int | None = None
    fps: int | None = None
    # Video models: the clip's length in seconds (OpenAI videos' ``seconds``), for a
    # request that names no ``num_frames``: admission makes it the nearest clip the
    # model makes at the fps that runs.
    seconds: float | None = None
    # What the engine adds on the request's way (never from a client: the HTTP, job and
    # CLI mappers leave it).
    carried: Carried = field(default_factory=lambda: Carried())

    @property
    def is_warmup(self) -> bool:
        return self.carried.is_warmup

    def carrying(self, **changes: Any) -> GenerationRequest:
        """This request with ``changes`` to what the engine carries (``stage_input``,
        ``trace_context``)."""
        return replace(self, carried=replace(self.carried, **changes))

    def __post_init__(self) -> None:
        object.__setattr__(self, "loras", _lora_pairs(self.loras))
        object.__setattr__(self, "images", tuple(self.images or ()))
        self._validate()
        _check_edit(self.images, self.mask, self.strength)

    def _validate(self) -> None:
        """Raise ``RequestError`` naming the bad value and the fix. Model-independent
        checks only."""
        if not isinstance(self.prompt, str) or not self.prompt.strip():
            raise RequestError("prompt must be a non-empty string", param="prompt")
        for name in ("height", "width"):
            value = getattr(self, name)
            if value is None:
                continue
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or value < 16
                or value % 16
            ):
                raise RequestError(
                    f"{name}={value!r} must be a positive multiple of 16 "
                    f"(e.g. {max(16, (int(value or 0) // 16) * 16)})",
                    param=name,
                )
        steps = self.num_inference_steps
        if steps is not None and (
            not isinstance(steps, int) or isinstance(steps, bool) or steps < 1
        ):
            raise RequestError(
                f"num_inference_steps={self.num_inference_steps!r} must "
                "be an integer >= 1",
                param="num_inference_steps",
            )
        if self.num_frames is not None and (
            not isinstance(self.num_frames, int)
            or isinstance(self.num_frames, bool)
            or not 1 <= self.num_frames <= MAX_FRAMES
        ):
            raise RequestError(
                f"num_frames={self.num_frames!r} must be an integer "
                f"in [1, {MAX_FRAMES}]",
                param="num_frames",
            )
        if self.fps is not None and (
            not isinstance(self.fps, int)
            or isinstance(self.fps, bool)
            or not 1 <= self.fps <= MAX_FPS
        ):
            raise RequestError(
                f"fps={self.fps!r} must be an integer in [1, {MAX_FPS}]", param="fps"
            )
        if self.seconds is not None:
            _check_float(self.seconds, "seconds", 0.0, float(MAX_FRAMES))
            if self.seconds <= 0:
                raise RequestError(
                    f"seconds={self.seconds!r} must be above 0", param="seconds"
                )
        if self.rewrite_prompt is not None and not isinstance(
            self.rewrite_prompt, bool
        ):
            raise RequestError(
                f"rewrite_prompt={self.rewrite_prompt!r} must be true or false",
                param="rewrite_prompt",
            )
        if not isinstance(self.conditioning_cache, bool):
            raise RequestError(
                f"conditioning_cache={self.conditioning_cache!r} must be true or false",
                param="conditioning_cache",
            )
        if not isinstance(self.n, int) or self.n < 1:
            raise RequestError(f"n={self.n!r} must be an integer >= 1", param="n")
        if self.guidance_scale is not None:
            _check_float(self.guidance_scale, "guidance_scale", 0.0, MAX_GUIDANCE_SCALE)
        _check_float(self.true_cfg_scale, "true_cfg_scale", 0.0, MAX_TRUE_CFG_SCALE)
        if self.true_cfg_scale < 1.0 and self.true_cfg_scale != 0:
            raise RequestError(
                f"true_cfg_scale={self.true_cfg_scale!r} must be >= "
                "1 (1 disables true CFG)",
                param="true_cfg_scale",
            )
        if self.seed is not None and not (0 <= self.seed <= MAX_SEED - self.n):
            raise RequestError(
                f"seed={self.seed!r} must be in [0, 2**63 - 1 - n]", param="seed"
            )
        length = self.max_sequence_length
        # Its upper bound is the model's text window, checked at admission
        # (PipelineCapabilities.check).
        if length is not None and (
            not isinstance(length, int) or isinstance(length, bool) or length < 1
        ):
            raise RequestError(
                f"max_sequence_length={self.max_sequence_length!r} must "
                "be an integer >= 1",
                param="max_sequence_length",
            )
        if self.cache_threshold is not None:
            _check_float(
                self.cache_threshold, "cache_threshold", 0.0, MAX_CACHE_THRESHOLD
            )
        if self.output_type not in ("pil", "latent", "pt"):
            raise RequestError(
                f"output_type={self.output_type!r} must be one of pil, latent, pt",
                param="output_type",
            )

    def with_defaults(
        self,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        max_sequence_length: int | None = None,
        cache_threshold: float | None = None,
        **video: int | None,
    ) -> GenerationRequest:
        """This request with its unset steps, guidance, text length, step-cache
        threshold (and, for a video model, ``num_frames``, ``fps``, ``height``,
        ``width`` in ``video``) filled from the given values (``None``: no default
        known, left unset). Admission passes the deployment's defaults and the model's
        limits; a library call (``models.base.library_admit``) the model family's."""
        given = {
            "num_inference_steps": num_inference_steps,
            "guidance_scale": guidance_scale,
            "max_sequence_length": max_sequence_length,
            "cache_threshold": cache_threshold,
            **video,
        }
        fill: dict[str, Any] = {
            name: value
            for name, value in given.items()
            if value is not None and getattr(self, name) is None
        }
        return replace(self, **fill) if fill else self

    def with_seed(self) -> GenerationRequest:
        """Return this request with a concrete seed (a random one if none was given).

        Called once, at admission (``EngineCore.submit``); everything downstream needs
        ``seeds``."""
        if self.seed is not None:
            return self
        return replace(self, seed=secrets.randbelow(2**31))

    @property
    def seeds(self) -> list[int]:
        """The seed of each image. Image i of a request equals a single-image request
        with seeds[i]."""
        if self.seed is None:
            raise RequestError(
                "request has no seed yet; call with_seed() first", param="seed"
            )
        return [self.seed + i for i in range(self.n)]


MAX_INPUT_IMAGES = 4  # images per edit request (the HTTP layer may bound it lower)


def _check_edit(images: tuple[Any, ...], mask: Any, strength: float | None) -> None:
    """Shapes and types of an edit's inputs (sizes against the model are checked at
    admission)."""
    if len(images) > MAX_INPUT_IMAGES:
        raise RequestError(
            f"{len(images)} input images; at most {MAX_INPUT_IMAGES}", param="image"
        )
    for image in images:
        shape, dtype = getattr(image, "shape", None), str(getattr(image, "dtype", ""))
        if (
            shape is None
            or len(shape) != 3
            or shape[2] != 3
            or dtype != "uint8"
            or min(shape[:2]) < 1
        ):
            raise RequestError(
                f"input images must be uint8 RGB arrays [H, W, 3], got {dtype} {shape}",
                param="image",
            )
    if mask is not None:
        if not images:
            raise RequestError("a mask needs an image to edit", param="mask")
        shape, dtype = getattr(mask, "shape", None), str(getattr(mask, "dtype", ""))
        if (
            shape is None
            or tuple(shape) != tuple(images[0].shape[:2])
            or dtype != "uint8"
        ):
            raise RequestError(
                "the mask must be uint8 [H, W] of the image's size "
                f"{tuple(images[0].shape[:2])}, "
                f"got {dtype} {shape}",
                param="mask",
            )
    if strength is not None:
        if (
            isinstance(strength, bool)
            or not isinstance(strength, (int, float))
            or not 0 < strength <= 1
        ):
            raise RequestError(
                f"strength={strength!r} must be a number in (0, 1]", param="strength"
            )
        if not images:
            raise RequestError("strength needs an input image", param="strength")


MAX_LORA_SCALE = (
    100.0  # the config's bound too; a deployment sets a tighter max_lora_scale
)


def _lora_pairs(value: Any) -> tuple[tuple[str, float], ...]:
    """``[(name, scale), ...]`` (or ``{"name": ..., "scale": ...}`` items) as a tuple of
    pairs, checked."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise RequestError(
            f"loras={value!r} must be a list of (name, scale)", param="loras"
        )
    pairs = []
    for item in value:
        if isinstance(item, dict):
            name, scale = item.get("name"), item.get("scale", 1.0)
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            name, scale = item
        else:
            raise RequestError(
                f"loras item {item!r} must be (name, scale)", param="loras"
            )
        if not isinstance(name, str) or not name.strip() or len(name) > 1024:
            raise RequestError(
                f"loras name {name!r} must be a non-empty string", param="loras"
            )
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or abs(scale) > MAX_LORA_SCALE
        ):
            raise RequestError(
                f"loras scale {scale!r} of {name!r} must be a finite number in "
                f"[-{MAX_LORA_SCALE:g}, {MAX_LORA_SCALE:g}]",
                param="loras",
            )
        pairs.append((name.strip(), float(scale)))
    if len({name for name, _ in pairs}) != len(pairs):
        raise RequestError(
            "loras names must be unique (combine scales into one entry)", param="loras"
        )
    return tuple(pairs)


def _check_float(value: object, name: str, low: float, high: float) -> None:
    """A finite number in ``[low, high]``: inf and NaN pass every ``<`` comparison, so
    test them first."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
    ):
        raise RequestError(f"{name}={value!r} must be a finite number", param=name)
    if not low <= value <= high:
        raise RequestError(
            f"{name}={value!r} must be in [{low:g}, {high:g}]", param=name
        )


@dataclass
class RequestOutput:
    """The result of one request: images (PIL, unless ``output_type`` asked for
    tensors), their seeds, per-phase timings in milliseconds (and the device's peak
    memory in each phase, MiB), and the attestation of what ran."""

    request_id: str
    images: list[Any]
    seeds: list[int]
    timings: dict[str, float]
    attestation: Attestation
    config_fingerprint: str
    width: int = 0
    height: int = 0
    num_inference_steps: int = 0
    guidance_scale: float | None = (
        None  # as run (the deployment's default when the request gave none)
    )
    prompt: str = ""
    # The prompt an AR stage drew from ``prompt`` (OpenAI's images API calls it
    # revised_prompt); None: not rewritten.
    revised_prompt: str | None = None
    finished: bool = True
    memory_peak_mib: dict[str, float] = field(default_factory=dict)
    # A video model's outputs: one uint8 array per video, (frames, height, width, 3)
    # ("pil" output), with ``images`` empty; ``num_frames`` and ``fps`` as run.
    videos: list[Any] = field(default_factory=list)
    num_frames: int = 0
    fps: int = 0


@dataclass(frozen=True)
class ProgressEvent:
    """Emitted once per denoise step of a request (``step`` counts from 1 to
    ``total_steps``)."""

    request_id: str
    step: int
    total_steps: int
