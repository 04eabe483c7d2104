"""The request and output envelopes shared by the engine, the executors, the worker and
the pipeline.

A ``GenerationRequest`` validates its own fields when it is built, so one that exists is
well formed; the deployment's limits and the model's capabilities are checked once more,
at admission (``engine/admission.py``), because only the engine knows them."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from diffserve.errors import RequestError
from diffserve.types.attestation import Attestation
from diffserve.types.request_checks import (
    MAX_CACHE_THRESHOLD,
    MAX_FPS,
    MAX_FRAMES,
    MAX_GUIDANCE_SCALE,
    MAX_PARTIAL_IMAGES,
    MAX_SEED,
    MAX_TRUE_CFG_SCALE,
    check_edit_inputs,
    check_float,
    check_int,
    lora_pairs,
)

OutputType = Literal["pil", "latent", "pt"]


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
    # None: the model's limit (FLUX 512, SD3 256, PixArt-Sigma 300)
    max_sequence_length: int | None = None
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
    # Partial images (0..3): the running latents decoded at evenly spaced steps and sent
    # as progress events before the result (image models that preview; 0: none).
    partial_images: int = 0
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
        object.__setattr__(self, "loras", lora_pairs(self.loras))
        object.__setattr__(self, "images", tuple(self.images or ()))
        _check_fields(self)
        check_edit_inputs(self.images, self.mask, self.strength)

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


def _check_fields(request: GenerationRequest) -> None:
    """Raise ``RequestError`` naming the bad value and the fix. Model-independent
    checks only."""
    if not isinstance(request.prompt, str) or not request.prompt.strip():
        raise RequestError("prompt must be a non-empty string", param="prompt")
    for name in ("height", "width"):
        value = getattr(request, name)
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
    steps = request.num_inference_steps
    if steps is not None and (
        not isinstance(steps, int) or isinstance(steps, bool) or steps < 1
    ):
        raise RequestError(
            f"num_inference_steps={request.num_inference_steps!r} must "
            "be an integer >= 1",
            param="num_inference_steps",
        )
    check_int(request.partial_images, "partial_images", 0, MAX_PARTIAL_IMAGES)
    if request.num_frames is not None:
        check_int(request.num_frames, "num_frames", 1, MAX_FRAMES)
    if request.fps is not None:
        check_int(request.fps, "fps", 1, MAX_FPS)
    if request.seconds is not None:
        check_float(request.seconds, "seconds", 0.0, float(MAX_FRAMES))
        if request.seconds <= 0:
            raise RequestError(
                f"seconds={request.seconds!r} must be above 0", param="seconds"
            )
    if request.rewrite_prompt is not None and not isinstance(
        request.rewrite_prompt, bool
    ):
        raise RequestError(
            f"rewrite_prompt={request.rewrite_prompt!r} must be true or false",
            param="rewrite_prompt",
        )
    if not isinstance(request.conditioning_cache, bool):
        raise RequestError(
            f"conditioning_cache={request.conditioning_cache!r} must be true or false",
            param="conditioning_cache",
        )
    if not isinstance(request.n, int) or request.n < 1:
        raise RequestError(f"n={request.n!r} must be an integer >= 1", param="n")
    if request.guidance_scale is not None:
        check_float(request.guidance_scale, "guidance_scale", 0.0, MAX_GUIDANCE_SCALE)
    check_float(request.true_cfg_scale, "true_cfg_scale", 0.0, MAX_TRUE_CFG_SCALE)
    if request.true_cfg_scale < 1.0 and request.true_cfg_scale != 0:
        raise RequestError(
            f"true_cfg_scale={request.true_cfg_scale!r} must be >= "
            "1 (1 disables true CFG)",
            param="true_cfg_scale",
        )
    if request.seed is not None and not (0 <= request.seed <= MAX_SEED - request.n):
        raise RequestError(
            f"seed={request.seed!r} must be in [0, 2**63 - 1 - n]", param="seed"
        )
    length = request.max_sequence_length
    # Its upper bound is the model's text window, checked at admission
    # (PipelineCapabilities.check).
    if length is not None and (
        not isinstance(length, int) or isinstance(length, bool) or length < 1
    ):
        raise RequestError(
            f"max_sequence_length={request.max_sequence_length!r} must "
            "be an integer >= 1",
            param="max_sequence_length",
        )
    if request.cache_threshold is not None:
        check_float(
            request.cache_threshold, "cache_threshold", 0.0, MAX_CACHE_THRESHOLD
        )
    if request.output_type not in ("pil", "latent", "pt"):
        raise RequestError(
            f"output_type={request.output_type!r} must be one of pil, latent, pt",
            param="output_type",
        )


MAX_INPUT_IMAGES = 4  # images per edit request (the HTTP layer may bound it lower)


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
    # As run (the deployment's default when the request gave none)
    guidance_scale: float | None = None
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
    # A model that makes sound: one float32 ``(channels, samples)`` waveform per video
    # at ``audio_sample_rate`` Hz (the MP4's audio track); empty otherwise.
    audios: list[Any] = field(default_factory=list)
    audio_sample_rate: int = 0


@dataclass(frozen=True)
class ProgressEvent:
    """Emitted once per denoise step of a request (``step`` counts from 1 to
    ``total_steps``)."""

    request_id: str
    step: int
    total_steps: int
    # A partial image decoded after this step: uint8 ``[n, H, W, 3]`` (one per image of
    # the request) and its 0-based number; None on a plain progress event.
    preview: Any = None
    preview_index: int = -1
