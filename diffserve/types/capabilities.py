"""What a loaded pipeline declares it can serve. It travels from the worker to the
engine in the ready handshake, and the engine checks every request against it at
admission (``engine/admission.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffserve.errors import RequestError
from diffserve.types.modality import IMAGE, SOUNDING_VIDEO, VIDEO, Modality

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.types.request import GenerationRequest


@dataclass(frozen=True)
class VideoCapabilities:
    """What a video model adds: ``num_frames`` must be ``k * temporal_factor + 1`` (the
    VAE's temporal compression times the transformer's temporal patch), and the size of
    a request that names none."""

    temporal_factor: int
    default_height: int
    default_width: int
    animates_image: bool = False  # every request sends its first frame (image-to-video)
    # A model that makes sound with its frames (LTX-2): its waveform's sample rate in Hz
    # (0: silent video).
    audio_sample_rate: int = 0


@dataclass(frozen=True)
class PipelineCapabilities:
    """What a loaded pipeline can serve; the engine validates every request against it
    at admission."""

    family: str  # registry.models key (model_index.json _class_name)
    default_size: int  # height/width of a request that gives none
    size_multiple: int  # height and width must be multiples of this
    max_sequence_length: int  # most text tokens per prompt
    true_cfg: bool  # runs a negative-prompt forward when true_cfg_scale > 1
    # Attention call sites, each with its own backend choice.
    attention_roles: tuple[str, ...]
    # Requests of one batch key can join a running batch at a step boundary
    # (``Pipeline.run(joins=)``).
    step_batching: bool = False
    # Which implementation serves the family: "native" (our denoiser) or "generic"
    # (diffusers' pipeline class, our kernels); reported in every attestation.
    implementation: str = "native"
    lora: bool = False  # per-request LoRA adapters (``GenerationRequest.loras``)
    # Image edits it runs: "img2img" (strength), "inpaint" (a mask), "reference" (images
    # as extra tokens).
    edits: tuple[str, ...] = ()
    # Every image of a batch is bit-identical to its request alone, by construction
    # (each sample through its own kernel calls: the stage's ``batch_invariant``);
    # reported in every attestation.
    batch_invariant: bool = False
    # The step-cache threshold of a request that names none: the stage's
    # ``cache.threshold`` (0: uncached).
    default_cache_threshold: float = 0.0
    # A video model (its outputs are videos: ``RequestOutput.videos``); None: an image
    # model.
    video: VideoCapabilities | None = None
    # Its edits take a strength (img2img, inpainting: how much of the schedule runs); a
    # reference edit may not.
    edit_strength: bool = True
    # It takes a request's negative prompt (FLUX.2-klein's pipeline has none: its CFG
    # branch is the empty prompt).
    negative_prompt: bool = True
    # The fewest denoising steps its scheduler can run (2 where a terminal shift
    # stretches the sigmas: one step divides by zero in diffusers'
    # FlowMatchEulerDiscreteScheduler and every pixel comes out NaN).
    min_inference_steps: int = 1
    # Pixels per side of one latent token of the denoiser (VAE downsampling x patch):
    # the cost model's unit (``step_tokens``).
    token_pixels: int = 16
    # It decodes partial images of its running latents while it denoises
    # (``GenerationRequest.partial_images``).
    partial_images: bool = False

    @property
    def modality(self) -> Modality:
        """What it makes (decided here, once: a pipeline that declares ``video`` makes
        videos)."""
        if self.video is None:
            return IMAGE
        return SOUNDING_VIDEO if self.video.audio_sample_rate else VIDEO

    def step_tokens(self, request: GenerationRequest) -> int:
        """The cost model: latent tokens one denoising step of ``request`` runs through
        the transformer (its images x tokens per image x latent frames of a clip).
        Admitted requests only (size and frames set)."""
        side = self.token_pixels
        height = request.height or self.default_size
        width = request.width or self.default_size
        tokens = -(-height // side) * -(-width // side)
        if self.video is not None and request.num_frames:
            tokens *= (request.num_frames - 1) // self.video.temporal_factor + 1
        return tokens * request.n

    def cost(self, request: GenerationRequest) -> int:
        """The whole request's work in token-steps (``step_tokens`` x steps)."""
        return self.step_tokens(request) * max(1, request.num_inference_steps or 1)

    def check(self, request: GenerationRequest) -> None:
        """Refuse (``RequestError``, HTTP 400) what this model cannot make: a size off
        its multiple, a text window above its limit, true CFG where it has none."""
        multiple = self.size_multiple
        for name in ("height", "width"):
            value = getattr(request, name)
            if value is not None and value % multiple:
                raise RequestError(
                    f"{name}={value} must be a multiple of {multiple} for this model "
                    f"(e.g. {max(multiple, value // multiple * multiple)})",
                    param=name,
                )
        steps = request.num_inference_steps
        if steps is not None and steps < self.min_inference_steps:
            raise RequestError(
                f"num_inference_steps={steps} is below this model's "
                f"{self.min_inference_steps}: its "
                "scheduler stretches the noise schedule to a terminal "
                "value and needs two steps at "
                "least",
                param="num_inference_steps",
            )
        length = request.max_sequence_length
        if length is not None and length > self.max_sequence_length:
            raise RequestError(
                f"max_sequence_length={length} is above this model's "
                f"{self.max_sequence_length} "
                "tokens",
                param="max_sequence_length",
            )
        if request.negative_prompt is not None and not self.negative_prompt:
            raise RequestError(
                f"{self.family} takes no negative prompt (its guidance "
                "contrasts with the empty "
                "prompt); leave negative_prompt unset",
                param="negative_prompt",
            )
        if (
            request.true_cfg_scale > 1
            and request.negative_prompt is not None
            and not self.true_cfg
        ):
            raise RequestError(
                f"{self.family} does not run true CFG as a second scale; "
                "leave true_cfg_scale at 1 "
                "(where the model runs classifier-free guidance, guidance_scale "
                "is its scale)",
                param="true_cfg_scale",
            )
        # Engine admission says so first (check_edit); a library call here.
        if request.images and not self.edits:
            raise RequestError(
                f"{self.family} ({self.implementation}) does not edit "
                "images on this deployment",
                param="image",
            )
        if request.partial_images and not self.partial_images:
            raise RequestError(
                f"{self.family} ({self.implementation}) does not decode partial images "
                "on this deployment; leave partial_images at 0",
                param="partial_images",
            )
        self.modality.check(request, self)
