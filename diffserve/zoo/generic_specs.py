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
from diffserve.zoo.flux_specs import T5_CONFIG, VAE_CONFIG
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
# Three deliberately different text widths, so that mix-ups fail loudly instead of
# happening to fit: the pipeline concatenates the two CLIP hidden states (32 + 48 = 80,
# zero-padded up to the T5 width) and the two CLIP projections (pooled_projection_dim =
# 80); joint_attention_dim is the T5 width (96).
SD3_CLIP_L_HIDDEN = 32
SD3_CLIP_G_HIDDEN = 48
SD3_T5_HIDDEN = 96

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


def _clip(hidden: int, *, act: str) -> dict[str, Any]:
    return {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 77,
        # SD3's CLIP-L and CLIP-G project to their own width (768, 1280)
        "projection_dim": hidden,
        "hidden_act": act,
    }


def _t5(hidden: int) -> dict[str, Any]:
    """T5 v1.1 (gated GELU) like FLUX's tiny T5, at another width."""
    return {**T5_CONFIG, "d_model": hidden, "d_ff": 2 * hidden}


def _sd3_transformer(
    *, sample_size: int, layers: int, heads: int, head_dim: int
) -> dict[str, Any]:
    return {
        "sample_size": sample_size,  # the pipeline's default latent size (image = 8x)
        "patch_size": 2,
        "in_channels": 16,
        "out_channels": 16,
        "num_layers": layers,
        "attention_head_dim": head_dim,
        "num_attention_heads": heads,
        "joint_attention_dim": SD3_T5_HIDDEN,
        # The context stream runs at the transformer width, so the caption projection
        # must match it.
        "caption_projection_dim": heads * head_dim,
        "pooled_projection_dim": SD3_CLIP_L_HIDDEN + SD3_CLIP_G_HIDDEN,
        # The sin-cos table is cropped to the image: latent side / patch <= 96, i.e.
        # images up to 1536 px.
        "pos_embed_max_size": 96,
        # SD3.0 style (SD3.5-medium lists MMDiT-X layers here)
        "dual_attention_layers": [],
        "qk_norm": None,
    }


# --- PixArt-Sigma
# -----------------------------------------------------------------------------
PIXART_T5_HIDDEN = 64

# PixArt-Sigma's scheduler_config.json (DPM-Solver++ 2M over PixArt's linear-beta
# epsilon schedule).
PIXART_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "beta_start": 0.0001,
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "prediction_type": "epsilon",
    "algorithm_type": "dpmsolver++",
    "solver_order": 2,
    "solver_type": "midpoint",
    "lower_order_final": True,
    "thresholding": False,
    "timestep_spacing": "linspace",
    "steps_offset": 0,
    "use_karras_sigmas": False,
    "euler_at_final": False,
}

# PixArt-Sigma ships SDXL's VAE: 4 latent channels, quant convs, scaling 0.13025, no
# shift.
PIXARTVAE_CONFIG: dict[str, Any] = {
    **VAE_CONFIG,
    "latent_channels": 4,
    "scaling_factor": 0.13025,
    "shift_factor": None,
    "use_quant_conv": True,
    "use_post_quant_conv": True,
    "force_upcast": True,
}


def _pixart_transformer(*, layers: int, heads: int, head_dim: int) -> dict[str, Any]:
    return {
        # sample_size 32 is PixArt-Sigma-256's: the pipeline's resolution binning
        # supports 32/64/128/256 only, and PixArt scales the sin-cos grid by image size
        # / 512 (interpolation_scale 0.5).
        "sample_size": 32,
        "interpolation_scale": 0.5,
        "patch_size": 2,
        "in_channels": 4,
        "out_channels": 8,  # learned sigma: the pipeline keeps the first half (epsilon)
        "num_layers": layers,
        "num_attention_heads": heads,
        "attention_head_dim": head_dim,
        "cross_attention_dim": heads
        * head_dim,  # text is projected to the transformer width first
        "caption_channels": PIXART_T5_HIDDEN,
        "norm_type": "ada_norm_single",
        "num_embeds_ada_norm": 1000,
        "norm_elementwise_affine": False,
        "norm_eps": 1e-6,
        "activation_fn": "gelu-approximate",
        "attention_bias": True,
        "attention_type": "default",
        "dropout": 0.0,
        "upcast_attention": False,
        # Sigma never uses PixArt-alpha's size/aspect conditions
        "use_additional_conditions": False,
    }


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
            _clip(SD3_CLIP_L_HIDDEN, act="quick_gelu"),
        ),
        TextEncoder(
            "text_encoder_2",
            "tokenizer_2",
            "clip",
            _clip(SD3_CLIP_G_HIDDEN, act="gelu"),
        ),
        TextEncoder("text_encoder_3", "tokenizer_3", "t5", _t5(SD3_T5_HIDDEN)),
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
        _sd3_transformer(sample_size=32, layers=2, heads=4, head_dim=32),
    ),
    # Hidden 768 (12 heads x 64), 6 joint blocks: ~123M transformer parameters; default
    # size 1024 px.
    "small-sd3": _sd3(
        "small-sd3",
        "~123M-parameter SD3-shaped transformer for benchmarks",
        _sd3_transformer(sample_size=128, layers=6, heads=12, head_dim=64),
    ),
    "tiny-pixart-sigma": GenericSpec(
        name="tiny-pixart-sigma",
        description="~1M-parameter PixArt-Sigma-shaped model for tests "
        "and demos (seconds to build)",
        pipeline="PixArtSigmaPipeline",
        transformer_class="PixArtTransformer2DModel",
        transformer=_pixart_transformer(layers=2, heads=4, head_dim=32),
        vae=dict(PIXARTVAE_CONFIG),
        scheduler_class="DPMSolverMultistepScheduler",
        scheduler=dict(PIXART_SCHEDULER_CONFIG),
        text_encoders=(
            TextEncoder("text_encoder", "tokenizer", "t5", _t5(PIXART_T5_HIDDEN)),
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
