"""Architecture configs of the hermetic generic diffusers DiT pipelines (SD3,
PixArt-Sigma, Qwen-Image, Z-Image).

Each kind keeps its real family's geometry (latent channels, VAE scale factor 8, patch
size 2, scheduler, text-encoder stack and how their outputs are combined) so every code
path of a real checkpoint is exercised; only widths and depths shrink. Plain dicts: they
go straight to the diffusers / transformers constructors and are cheap to import (no
torch here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffserve.errors import ConfigError
from diffserve.zoo.flux2_specs import (
    FLUX2_SCHEDULER_CONFIG,
    FLUX2_VAE_CONFIG,
    KLEIN_TEXT_LAYERS,
    dev_transformer,
    klein_transformer,
    mistral3_config,
)
from diffserve.zoo.flux_specs import VAE_CONFIG
from diffserve.zoo.generic_configs import (
    PIXART_SCHEDULER_CONFIG,
    PIXART_T5_HIDDEN,
    PIXARTVAE_CONFIG,
    SD3_CLIP_G_HIDDEN,
    SD3_CLIP_L_HIDDEN,
    SD3_T5_HIDDEN,
    clip,
    pixart_transformer,
    sd3_transformer,
    t5,
)
from diffserve.zoo.qwen_image_specs import (
    QWEN_IMAGE_SCHEDULER_CONFIG,
    QWEN_IMAGE_VAE_CONFIG,
    qwen2_5_vl_config,
    qwen_image_transformer,
)
from diffserve.zoo.z_image_specs import (
    Z_IMAGE_SCHEDULER_CONFIG,
    Z_IMAGE_VAE_CONFIG,
    qwen3_config,
    z_image_transformer,
)

# --- SD3
# --------------------------------------------------------------------------------------

# SD3's scheduler_config.json: a fixed shift of 3.0, no resolution-dependent shifting.
SD3_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}

# SD3's VAE is FLUX's layout (16 latent channels, no quant convs) with its own
# normalisation constants.
SD3VAE_CONFIG: dict[str, Any] = {
    **VAE_CONFIG,
    "scaling_factor": 1.5305,
    "shift_factor": 0.0609,
}


# --- PixArt-Sigma
# -----------------------------------------------------------------------------


# --- specs
# ------------------------------------------------------------------------------------
# Text encoder kinds: the transformers model class and the tokenizer class
# model_index.json names. T5TokenizerFast: what SD3 repos name; it reads tokenizer.json
# alone (PixArt repos name the sentencepiece T5Tokenizer, which transformers 4.x could
# not load without spiece.model).
ENCODER_CLASSES: dict[str, tuple[str, str]] = {
    "clip": ("CLIPTextModelWithProjection", "CLIPTokenizer"),
    "t5": ("T5EncoderModel", "T5TokenizerFast"),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2Tokenizer"),
    "qwen3": ("Qwen3Model", "Qwen2Tokenizer"),  # Z-Image
    "qwen3_causal": ("Qwen3ForCausalLM", "Qwen2TokenizerFast"),  # FLUX.2-klein
    "mistral3": ("Mistral3ForConditionalGeneration", "PixtralProcessor"),  # FLUX.2-dev
}


@dataclass(frozen=True)
class TextEncoder:
    """One text encoder and its tokenizer. ``kind``: one of ``ENCODER_CLASSES``."""

    component: str
    tokenizer: str
    kind: str
    config: dict[str, Any]


@dataclass(frozen=True)
class GenericSpec:
    """Everything that defines one buildable generic diffusers pipeline kind."""

    name: str
    description: str
    pipeline: str  # the diffusers pipeline class, model_index.json's _class_name
    transformer_class: str
    transformer: dict[str, Any]
    vae: dict[str, Any]
    scheduler_class: str
    scheduler: dict[str, Any]
    text_encoders: tuple[TextEncoder, ...]
    vae_class: str = "AutoencoderKL"
    # Pipeline config entries of model_index.json.
    index_extras: tuple[tuple[str, Any], ...] = ()
    # a Qwen2-VL processor (``processor/``): the edit pipelines' image-and-text input
    vl_processor: bool = False

    def model_index(self) -> dict[str, Any]:
        """model_index.json's component entries (without _diffusers_version)."""
        index: dict[str, Any] = {
            "_class_name": self.pipeline,
            "scheduler": ["diffusers", self.scheduler_class],
            "transformer": ["diffusers", self.transformer_class],
            "vae": ["diffusers", self.vae_class],
            **dict(self.index_extras),
        }
        if self.vl_processor:
            index["processor"] = ["transformers", "Qwen2VLProcessor"]
        for enc in self.text_encoders:
            model_class, tokenizer_class = ENCODER_CLASSES[enc.kind]
            index[enc.component] = ["transformers", model_class]
            index[enc.tokenizer] = ["transformers", tokenizer_class]
        return index


def _sd3_encoders() -> tuple[TextEncoder, ...]:
    return (
        TextEncoder(
            "text_encoder",
            "tokenizer",
            "clip",
            clip(SD3_CLIP_L_HIDDEN, act="quick_gelu"),
        ),
        TextEncoder(
            "text_encoder_2", "tokenizer_2", "clip", clip(SD3_CLIP_G_HIDDEN, act="gelu")
        ),
        TextEncoder("text_encoder_3", "tokenizer_3", "t5", t5(SD3_T5_HIDDEN)),
    )


def _sd3(name: str, description: str, transformer: dict[str, Any]) -> GenericSpec:
    return GenericSpec(
        name=name,
        description=description,
        pipeline="StableDiffusion3Pipeline",
        transformer_class="SD3Transformer2DModel",
        transformer=transformer,
        vae=dict(SD3VAE_CONFIG),
        scheduler_class="FlowMatchEulerDiscreteScheduler",
        scheduler=dict(SD3_SCHEDULER_CONFIG),
        text_encoders=_sd3_encoders(),
    )


def _qwen_image(
    name: str, description: str, pipeline: str, *, vl_processor: bool = False
) -> GenericSpec:
    return GenericSpec(
        name=name,
        description=description,
        pipeline=pipeline,
        transformer_class="QwenImageTransformer2DModel",
        transformer=qwen_image_transformer(layers=2, heads=4, head_dim=32),
        vae=dict(QWEN_IMAGE_VAE_CONFIG),
        vae_class="AutoencoderKLQwenImage",
        scheduler_class="FlowMatchEulerDiscreteScheduler",
        scheduler=dict(QWEN_IMAGE_SCHEDULER_CONFIG),
        text_encoders=(
            TextEncoder("text_encoder", "tokenizer", "qwen2_5_vl", qwen2_5_vl_config()),
        ),
        vl_processor=vl_processor,
    )


GENERIC_SPECS: dict[str, GenericSpec] = {
    "tiny-sd3": _sd3(
        "tiny-sd3",
        "~1M-parameter SD3-shaped model for tests and demos (seconds to build)",
        sd3_transformer(sample_size=32, layers=2, heads=4, head_dim=32),
    ),
    # Hidden 768 (12 heads x 64), 6 joint blocks: ~123M transformer parameters; default
    # size 1024 px.
    "small-sd3": _sd3(
        "small-sd3",
        "~123M-parameter SD3-shaped transformer for benchmarks",
        sd3_transformer(sample_size=128, layers=6, heads=12, head_dim=64),
    ),
    "tiny-pixart-sigma": GenericSpec(
        name="tiny-pixart-sigma",
        description="~1M-parameter PixArt-Sigma-shaped model for tests "
        "and demos (seconds to build)",
        pipeline="PixArtSigmaPipeline",
        transformer_class="PixArtTransformer2DModel",
        transformer=pixart_transformer(layers=2, heads=4, head_dim=32),
        vae=dict(PIXARTVAE_CONFIG),
        scheduler_class="DPMSolverMultistepScheduler",
        scheduler=dict(PIXART_SCHEDULER_CONFIG),
        text_encoders=(
            TextEncoder("text_encoder", "tokenizer", "t5", t5(PIXART_T5_HIDDEN)),
        ),
    ),
    "tiny-qwen-image": _qwen_image(
        "tiny-qwen-image",
        "~2M-parameter Qwen-Image-shaped model (Qwen2.5-VL "
        "text encoder) for tests and demos",
        "QwenImagePipeline",
    ),
    "tiny-qwen-image-edit": _qwen_image(
        "tiny-qwen-image-edit",
        "tiny-qwen-image as Qwen-Image-Edit: the input image "
        "read by the Qwen2.5-VL encoder",
        "QwenImageEditPipeline",
        vl_processor=True,
    ),
    "tiny-qwen-image-edit-plus": _qwen_image(
        "tiny-qwen-image-edit-plus",
        "tiny-qwen-image as Qwen-Image-Edit-Plus (2509): reference "
        "images as 'Picture n'",
        "QwenImageEditPlusPipeline",
        vl_processor=True,
    ),
    "tiny-z-image": GenericSpec(
        name="tiny-z-image",
        description="~1M-parameter Z-Image-shaped model (Qwen3 text encoder) "
        "for tests and demos",
        pipeline="ZImagePipeline",
        transformer_class="ZImageTransformer2DModel",
        transformer=z_image_transformer(layers=2, heads=4, head_dim=32),
        vae=dict(Z_IMAGE_VAE_CONFIG),
        scheduler_class="FlowMatchEulerDiscreteScheduler",
        scheduler=dict(Z_IMAGE_SCHEDULER_CONFIG),
        text_encoders=(
            TextEncoder("text_encoder", "tokenizer", "qwen3", qwen3_config(layers=2)),
        ),
    ),
    "tiny-flux2-klein": GenericSpec(
        name="tiny-flux2-klein",
        description="~1M-parameter FLUX.2-klein-shaped model (Qwen3 text "
        "encoder) for tests and demos",
        pipeline="Flux2KleinPipeline",
        transformer_class="Flux2Transformer2DModel",
        transformer=klein_transformer(),
        vae=dict(FLUX2_VAE_CONFIG),
        vae_class="AutoencoderKLFlux2",
        scheduler_class="FlowMatchEulerDiscreteScheduler",
        scheduler=dict(FLUX2_SCHEDULER_CONFIG),
        # The pipeline stacks hidden states 9, 18 and 27: the encoder keeps that depth
        # (at width 64).
        text_encoders=(
            TextEncoder(
                "text_encoder",
                "tokenizer",
                "qwen3_causal",
                qwen3_config(layers=KLEIN_TEXT_LAYERS[-1]),
            ),
        ),
        index_extras=(("is_distilled", False),),
    ),
    "tiny-flux2": GenericSpec(
        name="tiny-flux2",
        description="~1M-parameter FLUX.2-dev-shaped model (Mistral3 text "
        "encoder) for tests and demos",
        pipeline="Flux2Pipeline",
        transformer_class="Flux2Transformer2DModel",
        transformer=dev_transformer(),
        vae=dict(FLUX2_VAE_CONFIG),
        vae_class="AutoencoderKLFlux2",
        scheduler_class="FlowMatchEulerDiscreteScheduler",
        scheduler=dict(FLUX2_SCHEDULER_CONFIG),
        text_encoders=(
            TextEncoder("text_encoder", "tokenizer", "mistral3", mistral3_config()),
        ),
    ),
}


def get_generic_spec(kind: str) -> GenericSpec:
    """Look up a generic model kind; unknown names raise a ConfigError that lists the
    known ones."""
    try:
        return GENERIC_SPECS[kind]
    except KeyError:
        raise ConfigError(
            f"unknown model {kind!r}",
            path="model",
            hint=f"choose one of: {', '.join(GENERIC_SPECS)}",
        ) from None
