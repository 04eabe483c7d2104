"""``ModelFamily``: what the resolver, admission and the worker must know about a family
before any weight is read, grouped by concern: the request defaults its checkpoints come
with, how far it parallelizes, what its pipeline runs beyond text to image (edits,
adapters, step caches, single files, stages, quantization), and, for a family served by
diffusers' own pipeline class, how that class is driven (``models/generic``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diffserve.registry.targets import load_target

# FLUX.1's T5 window: the text limit of the FLUX families (and the longest any family
# reads).
T5_MAX_TOKENS = 512
GENERIC_PIPELINE = "diffserve.models.generic.pipeline:GenericPipeline"


@dataclass(frozen=True)
class FirstBlockCacheSpec:
    """Where First-Block Cache hooks into a generic family's denoiser
    (models/generic/step_cache.py): its block list, the index of the image tokens in a
    block's output tuple, and the block's keyword inputs in the order of its outputs
    (what a skipped block passes through)."""

    blocks: str = "transformer_blocks"
    image_output: int = 1
    block_outputs: tuple[str, ...] = ("encoder_hidden_states", "hidden_states")


# MMDiT blocks that return (text, image) and whose text stream the forward drops after
# the last block.
MMDIT_FIRST_BLOCK_CACHE = FirstBlockCacheSpec()


@dataclass(frozen=True)
class FamilyDefaults:
    """What a request that names none gets (source ``model`` in ``config explain``): the
    real checkpoints' pipeline defaults, e.g. SD3's 28 steps at CFG 7.0; a video
    family's clip and size (diffusers' ``__call__``)."""

    steps: int = 28
    guidance_scale: float = 3.5
    # The pipeline's text cap (its __call__'s limit)
    max_sequence_length: int = T5_MAX_TOKENS
    num_frames: int | None = None  # None: an image family
    fps: int | None = None
    height: int = 0
    width: int = 0

    @property
    def modality(self) -> str:
        """ "video" for a family with frames, else "image": what it makes, decided here
        for the registry's readers (a loaded pipeline's
        ``PipelineCapabilities.modality`` says the same)."""
        return "video" if self.num_frames is not None else "image"

    def request_defaults(self) -> dict[str, Any]:
        """These defaults as ``request_defaults`` keys (the config's model layer, and a
        library call's admission): steps and guidance, and a video family's clip."""
        keys: dict[str, Any] = {
            "num_inference_steps": self.steps,
            "guidance_scale": self.guidance_scale,
        }
        if self.modality == "video":
            keys.update(num_frames=self.num_frames, fps=self.fps)
        return keys


@dataclass(frozen=True)
class Parallelism:
    max_world_size: int = 1  # ranks one replica may span (1: no parallel denoising)
    # The ``parallel.*`` degrees its pipeline implements (config/layout.py)
    dims: tuple[str, ...] = ()


@dataclass(frozen=True)
class Features:
    """What its pipeline runs beyond text to image."""

    # Image edits: "img2img" (strength), "inpaint" (a mask), "reference" (the input
    # image's latents as extra tokens, FLUX.1 Kontext), "first_frame" (image to video);
    # registry/edits.py. Empty: text to image only.
    edits: tuple[str, ...] = ()
    # "module:function" that admission calls with (loras, stage, model_dir) to check and
    # canonicalize a request's LoRA adapters; None: the family takes no adapters.
    lora_check: str | None = None
    # The step caches its native pipeline runs (models/stepcache; TeaCache where a
    # polynomial fits the model).
    step_caches: tuple[str, ...] = ()
    # The components its native pipeline can read from one file (``components: {name:
    # FILE}``) instead of the model's folder; any other is refused at resolve
    # (config/resolve.py), as is any on the generic path.
    single_file_components: tuple[str, ...] = ()
    # What its outputs carry beyond RGB pixels: "alpha" (RGBA images, Qwen-Image-2.1),
    # "audio" (a video's sound, LTX-2); shown in the support matrix.
    output_extras: tuple[str, ...] = ()
    # The pipelines of the stages other than denoising (role -> "module:Class"), for
    # topologies that split them off (config.schema.TOPOLOGIES); a topology whose roles
    # a family lacks is refused at resolve.
    stage_pipelines: tuple[tuple[str, str], ...] = ()
    # ``quantization_ignored_layers`` of a stage that sets none (source ``model``): the
    # denoiser's modules that stay in the stage's dtype when it is quantized, by module
    # name (the native and the diffusers names where a family has both): the embedders,
    # the adaLN modulation and the final layer (docs/quantization.md).
    quantization_ignored_layers: tuple[str, ...] = ()
    # The per-block modulation projections (one row per image: GEMVs, where quantizing
    # the activation costs more than the narrower weight saves): kept in the stage's
    # dtype on GPUs too (models/flux/build.py; attested in ``ignored_patterns``).
    gpu_quantization_ignored_layers: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenericPath:
    """How diffusers' own pipeline class of the family is driven on our kernels
    (``models/generic``)."""

    # (substring of the denoiser's module path, role) per attention module, first match
    # wins, so a role can be chosen per call site; roles whose calls carry a mask
    # (padded text) need a backend that takes one.
    role_patterns: tuple[tuple[str, str], ...] = ()
    masked_roles: tuple[str, ...] = ()
    # The ``__call__`` keyword a request's guidance scale goes to ("true_cfg_scale"
    # where the pipeline's ``guidance_scale`` is a distilled-guidance input), and the
    # negative prompt its CFG needs when a request names none (None: the pipeline runs
    # CFG without one; Qwen-Image skips CFG without a negative prompt, and its model
    # card passes " ").
    cfg_argument: str = "guidance_scale"
    cfg_negative_prompt: str | None = None
    # Where First-Block Cache hooks in (None: no step cache on the generic path).
    # TeaCache needs a polynomial fitted per family (registry/teacache.py): none is
    # published for these.
    first_block_cache: FirstBlockCacheSpec | None = None
    # Keywords every call of the pipeline gets (PixArt-Sigma: the size asked for, not
    # the nearest trained bucket).
    call_overrides: tuple[tuple[str, Any], ...] = ()
    # The guidance scale lives in the pipeline's ``guider`` component, not in a
    # ``__call__`` keyword (HunyuanVideo-1.5): each batch gets a guider of its scale.
    guider: bool = False
    # The VAE decodes a batch one sample at a time (HunyuanVideo-1.5's decoder breaks
    # on batches of several).
    vae_slicing: bool = False
    # The text window must be a multiple of this (LTX-2's connectors append 128
    # registers): a request's ``max_sequence_length`` is rounded up to it.
    text_window_multiple: int = 1
    # The pipeline attribute that holds its text window where ``__call__`` takes none
    # (HunyuanVideo-1.5's ``tokenizer_max_length``: prompts padded to 1000 tokens): set
    # to each batch's ``max_sequence_length``.
    text_window_attribute: str | None = None
    # A request's height and width must be multiples of this where the pipeline packs
    # latent patches its VAE and image processor do not say (Qwen-Image-2.1: 2x2 over
    # a 16x VAE); 0: read off the pipeline (models/generic/capabilities.py).
    size_multiple: int = 0
    # The denoiser's keyword that says whether a forward fills the prefix KV cache or
    # reads it (Qwen-Image-2.1: ``kv_cache_mode`` "extract" / "cached"), counted and
    # attested per request (``prefix_kv_cache``); None: no prefix cache.
    prefix_kv_cache: str | None = None
    # The pipeline method that encodes a batch of prompts into padded tensors (each
    # ``[B, L, ...]``, zero-padded on the right), run through the exact conditioning
    # cache one prompt at a time (``models/generic/text_cache.py``); None: not cached.
    prompt_encoder: str | None = None


@dataclass(frozen=True)
class ModelFamily:
    """One family, keyed by ``model_index.json``'s ``_class_name``."""

    class_name: str
    pipeline: str  # "module:Class" of the pipeline (a models.base.Pipeline)
    topology: str  # default stage layout (config.schema.TOPOLOGIES)
    # Attention call sites that may get their own backend.
    attention_roles: tuple[str, ...]
    # "native" (our denoiser) or "generic" (diffusers' pipeline, our kernels)
    implementation: str = "native"
    denoiser: str = "transformer"  # component name of the denoiser in model_index.json
    defaults: FamilyDefaults = field(default_factory=FamilyDefaults)
    parallel: Parallelism = field(default_factory=Parallelism)
    features: Features = field(default_factory=Features)
    generic: GenericPath = field(default_factory=GenericPath)

    def load_stage_pipeline(self, role: str) -> Any:
        """The pipeline class serving ``role`` (``diffusion``: the family's own, see
        ``load_pipeline_class``)."""
        return load_target(dict(self.features.stage_pipelines)[role])

    def check_loras(
        self, loras: tuple[tuple[str, float], ...], stage: Any, model_dir: str
    ) -> tuple[tuple[str, float], ...]:
        """The family's admission check of a request's adapters (``lora_check``),
        imported on first use."""
        if self.features.lora_check is None:
            raise ValueError(f"{self.class_name} takes no LoRA adapters")
        checked: tuple[tuple[str, float], ...] = load_target(self.features.lora_check)(
            loras, stage, model_dir
        )
        return checked

    def load_pipeline_class(self, implementation: str | None = None) -> Any:
        """The pipeline class serving this family on ``implementation`` (default: the
        family's own)."""
        generic = (implementation or self.implementation) == "generic"
        return load_target(GENERIC_PIPELINE if generic else self.pipeline)


# --- Vocabulary the registry's entries share

# The step caches the native denoisers run (models/stepcache).
NATIVE_STEP_CACHES = ("fbcache", "teacache")
# The generic path's LoRA check: diffusers/PEFT files keyed by the denoiser's own module
# names.
GENERIC_LORA_CHECK = "diffserve.models.generic.lora:check_lora_request"
# CFG-parallel (the two CFG branches on two ranks) times Ulysses (the image or video
# tokens; the degree must divide the heads, checked at load: models/runner/branches.py).
CFG_TIMES_ULYSSES = Parallelism(
    max_world_size=16, dims=("cfg_parallel_size", "ulysses_degree")
)
MMDIT_ROLES = GenericPath(
    role_patterns=(("", "joint_block"),), first_block_cache=MMDIT_FIRST_BLOCK_CACHE
)
