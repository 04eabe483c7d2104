"""The kinds ``diffserve make-model`` builds, and its help text: listed here (not
read from the builders' spec tables) so that building the CLI parser stays
import-light. tests/zoo/test_flux_builder.py keeps the lists equal to the spec
tables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from diffserve.registry.targets import load_target

# Kept in sync with diffserve.zoo.flux_specs.SPECS and
# tiny_generic_configs.GENERIC_SPECS (a test checks it); listed here so that building
# the parser stays import-light.
FLUX_KINDS = ("tiny-flux", "tiny-flux-kontext", "small-flux")
GENERIC_KINDS = (
    "tiny-sd3",
    "small-sd3",
    "tiny-pixart-sigma",
    "tiny-qwen-image",
    "tiny-qwen-image-edit",
    "tiny-qwen-image-edit-plus",
    "tiny-z-image",
    "tiny-flux2-klein",
    "tiny-flux2",
)
# Diffserve.zoo.wan_specs.WAN_SPECS.
WAN_KINDS = ("tiny-wan", "tiny-wan22", "tiny-wan22-i2v", "small-wan")
LORA_KINDS = ("tiny-flux-lora",)  # an adapter for a FLUX model (--base), not a model
# Trained on CPU by diffserve.zoo.toy_shapes: copied from the package, or retrained with
# --train.
TRAINED_KINDS = ("toy-shapes",)  # the demo model
# The toy video model (diffserve.zoo.toy_motion): trained with --train.
TRAINED_VIDEO_KINDS = ("toy-motion",)
TRAINED_LORA_KINDS = ("toy-shapes-stars",)  # its circles-to-stars adapter
# Causal language models (Hugging Face's layout, which vLLM loads) for the AR
# prompt-rewrite stage: random ones (diffserve.zoo.llm.specs.LLM_SPECS, a test checks
# it), and the toy prompter (diffserve.zoo.llm.train), copied from the package or
# retrained with --train.
LLM_KINDS = ("tiny-qwen3", "tiny-qwen3-moe")
TRAINED_LLM_KINDS = ("toy-prompter",)
# Families whose tiny builder is a module of its own (kind -> "module:function", the
# function called as ``(kind, dir, seed=, force=)``).
OWN_BUILDER_KINDS: dict[str, str] = {
    "tiny-qwen-image-21": "diffserve.zoo.qwen_image21:build_qwen_image21_model",
    "tiny-ltx2": "diffserve.zoo.ltx2:build_ltx2_model",
    "tiny-hunyuan-video-15": (
        "diffserve.zoo.hunyuan_video15:build_hunyuan_video15_model"
    ),
}
MODEL_KINDS = FLUX_KINDS + GENERIC_KINDS + WAN_KINDS + tuple(OWN_BUILDER_KINDS)


def own_builder(kind: str) -> Callable[..., Path]:
    """The builder function of an ``OWN_BUILDER_KINDS`` kind (imported on use)."""
    builder: Callable[..., Path] = load_target(OWN_BUILDER_KINDS[kind])
    return builder


DESCRIPTION = (
    "Write a pipeline directory in diffusers layout (a "
    "language model: Hugging Face's causal-LM layout) with "
    "random weights from a seeded generator. "
    "FLUX.1 kinds (FluxPipeline): tiny-flux for tests and "
    "demos, small-flux (~150M parameters) for "
    "benchmarks; tiny-flux-kontext is FLUX.1 Kontext (FluxKontextPipeline, "
    "edits from a reference image). Generic diffusers DiT "
    "pipelines: tiny-sd3 and small-sd3 (~123M-parameter "
    "transformer) are StableDiffusion3Pipeline, tiny-pixart-sigma "
    "is PixArtSigmaPipeline, tiny-qwen-image is "
    "QwenImagePipeline (a Qwen2.5-VL text encoder and a "
    "Qwen2 tokenizer made locally), tiny-qwen-image-edit "
    "its QwenImageEditPipeline twin (edits), tiny-qwen-image-edit-plus "
    "its QwenImageEditPlusPipeline one, "
    "tiny-z-image is "
    "ZImagePipeline and tiny-flux2-klein is Flux2KleinPipeline "
    "(Qwen3 text encoders), tiny-flux2 is "
    "Flux2Pipeline (a Mistral3 text encoder and a Pixtral "
    "processor). Video (Wan): tiny-wan "
    "(Wan2.1 text-to-video, WanPipeline), tiny-wan22 (Wan2.2's "
    "two experts), tiny-wan22-i2v (Wan2.2 "
    "image-to-video, WanImageToVideoPipeline), small-wan "
    "(~90M parameters, benchmarks). "
    "Families with their own builder: tiny-qwen-image-21 (QwenImage21Pipeline: "
    "Qwen3-VL encoder, prefix KV cache, RGBA images), tiny-ltx2 (LTX2Pipeline: a "
    "video and its 24 kHz audio) and tiny-hunyuan-video-15 "
    "(HunyuanVideo15Pipeline). "
    "The same seed gives byte-identical files. toy-shapes "
    "is the trained demo model (draws 'a red circle "
    "on a blue background'), and toy-motion, the trained "
    "toy video model ('a yellow square moving right on "
    "a "
    "black background'): copied from the package, or trained "
    "from scratch on this CPU with --train; "
    "toy-shapes-stars is toy-shapes' circles-to-stars LoRA "
    "(draws a star where the prompt says circle), copied "
    "or trained (--train, about a minute) for the toy model "
    "at --base (default: the shipped one). "
    "Language models (Hugging Face causal-LM layout, which "
    "transformers and vLLM load; a Qwen tokenizer made "
    "locally, with a Qwen chat template): tiny-qwen3 (Qwen3ForCausalLM) "
    "and tiny-qwen3-moe "
    "(Qwen3MoeForCausalLM, 4 experts, 2 per token) have "
    "random weights; toy-prompter is trained to expand "
    "short prompts into the toy models' grammars ('red "
    "circle' -> 'a red circle on a blue background'), "
    "copied from the package or trained here with --train "
    "(one to three minutes)."
)
