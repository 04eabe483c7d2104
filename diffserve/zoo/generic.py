"""Build hermetic, random-weight generic diffusers DiT pipelines (``tiny-sd3``,
``small-sd3``, ``tiny-pixart-sigma``, ``tiny-qwen-image``, ``tiny-qwen-image-edit``,
``tiny-qwen-image-edit-plus``, ``tiny-z-image``, ``tiny-flux2-klein``, ``tiny-flux2``).

The FLUX builder's contract, for other pipeline families: the output is a
diffusers-layout directory that the plain diffusers pipeline class's
``from_pretrained(dir)`` reads and runs (tests/zoo/test_plain_diffusers_loads.py); where
a component is a processor transformers builds only with torchvision (the
Qwen-Image-Edit kinds' ``processor/``, tiny-flux2's ``tokenizer/``, as in the real
checkpoints) the marker file names it (``needs_torchvision``) and a build without
torchvision says so. Every weight comes from a per-component seeded generator and every
file is written deterministically, so the same seed reproduces byte-identical files;
weights are safetensors only; nothing is downloaded; a build goes into a staging
directory beside the target and is renamed into place only when complete. The configs
live in ``generic_specs``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffserve.logging import get_logger
from diffserve.zoo.components import MARKER_FILE, save_components, write_json
from diffserve.zoo.generic_specs import (
    ENCODER_CLASSES,
    GENERIC_SPECS,
    GenericSpec,
    TextEncoder,
    get_generic_spec,
)
from diffserve.zoo.publish import build_seeded

__all__ = ["BUILDER_VERSION", "GENERIC_SPECS", "build_generic_model"]

logger = get_logger(__name__)


# Bump when the files a build writes change (recorded in the marker file). 2: the marker
# names the components that need torchvision (``needs_torchvision``).
BUILDER_VERSION = 2


def build_generic_model(
    kind: str, out_dir: Path | str, *, seed: int = 0, force: bool = False
) -> Path:
    """Write a random-weight pipeline of ``kind`` (one of GENERIC_SPECS) to ``out_dir``;
    return its path.

    An existing non-empty ``out_dir`` is an error unless ``force`` is set, and even then
    only a previous model directory (one with ``model_index.json``) is replaced. Raises
    ConfigError for every bad argument.
    """
    spec = get_generic_spec(kind)
    out = build_seeded(
        kind,
        out_dir,
        seed,
        lambda staging, seed: _write_pipeline(spec, staging, seed=seed),
        force=force,
    )
    _warn_without_torchvision(spec, out)
    return out


def _warn_without_torchvision(spec: GenericSpec, out: Path) -> None:
    """Say which component a plain diffusers load of ``out`` cannot build here, and what
    to hand it instead: the files are right (real checkpoints name the same processor
    classes), but transformers builds those only with torchvision, and its error (a
    placeholder class diffusers cannot load) names neither."""
    import importlib.util

    from diffserve.registry.processors import (
        TORCHVISION_PROCESSORS,
        torchvision_components,
    )

    if importlib.util.find_spec("torchvision") is not None:
        return
    for component, class_name in torchvision_components(spec.model_index()).items():
        logger.warning(
            "%s: plain diffusers cannot load its %s/ (%s) here: "
            "%s, which is not installed; load the "
            "pipeline with that component handed in (docs/models.md, "
            "Hermetic test models)",
            spec.name,
            component,
            class_name,
            TORCHVISION_PROCESSORS[class_name],
        )


def _write_pipeline(spec: GenericSpec, out: Path, *, seed: int) -> None:
    import diffusers

    from diffserve.registry.processors import torchvision_components
    from diffserve.zoo.flux2_specs import MISTRAL_CHAT_TEMPLATE, MISTRAL_SPECIAL_TOKENS
    from diffserve.zoo.lm_tokenizers import (
        write_pixtral_processor,
        write_qwen_tokenizer,
        write_vl_processor,
    )
    from diffserve.zoo.tokenizers import write_clip_tokenizer, write_t5_tokenizer
    from diffserve.zoo.z_image_specs import QWEN3_CHAT_TEMPLATE

    def write_qwen3_tokenizer(out_dir: Path) -> int:
        return write_qwen_tokenizer(out_dir, chat_template=QWEN3_CHAT_TEMPLATE)

    def write_mistral_processor(out_dir: Path) -> int:
        return write_pixtral_processor(
            out_dir, MISTRAL_CHAT_TEMPLATE, MISTRAL_SPECIAL_TOKENS
        )

    writers = {
        "clip": write_clip_tokenizer,
        "t5": write_t5_tokenizer,
        "qwen2_5_vl": write_qwen_tokenizer,
        "qwen3": write_qwen3_tokenizer,
        "qwen3_causal": write_qwen3_tokenizer,
        "mistral3": write_mistral_processor,
    }
    factories: dict[str, Callable[[], Any]] = {}
    for enc in spec.text_encoders:
        vocab_size = writers[enc.kind](out / enc.tokenizer)
        factories[enc.component] = _text_encoder_factory(
            enc, vocab_size, out / enc.tokenizer
        )
    if spec.vl_processor:
        write_vl_processor(out / "processor", out / spec.text_encoders[0].tokenizer)
    getattr(diffusers, spec.scheduler_class)(**spec.scheduler).save_pretrained(
        str(out / "scheduler")
    )
    factories["vae"] = lambda: getattr(diffusers, spec.vae_class)(**spec.vae)
    factories["transformer"] = lambda: getattr(diffusers, spec.transformer_class)(
        **spec.transformer
    )

    save_components(factories, out, seed)

    write_json(
        out / "model_index.json",
        {**spec.model_index(), "_diffusers_version": diffusers.__version__},
    )
    marker: dict[str, Any] = {
        "builder_version": BUILDER_VERSION,
        "kind": spec.name,
        "description": spec.description,
        "pipeline": spec.pipeline,
        "seed": seed,
        "random_weights": True,
    }
    # What a plain diffusers load without torchvision must be handed ({component:
    # class}), written whether or not torchvision is here so that the files stay the
    # same everywhere.
    needs_torchvision = torchvision_components(spec.model_index())
    if needs_torchvision:
        marker["needs_torchvision"] = needs_torchvision
    write_json(out / MARKER_FILE, marker)


def _text_encoder_factory(
    enc: TextEncoder, vocab_size: int, tokenizer_dir: Path
) -> Callable[[], Any]:
    from transformers import (
        CLIPTextConfig,
        CLIPTextModelWithProjection,
        T5Config,
        T5EncoderModel,
    )

    from diffserve.zoo.tokenizers import CLIP_BOS, CLIP_EOS, clip_vocab_and_merges

    if enc.kind == "qwen2_5_vl":
        return _qwen2_5_vl_factory(enc, vocab_size, tokenizer_dir)
    if enc.kind in ("qwen3", "qwen3_causal"):
        return _qwen3_factory(enc, vocab_size, tokenizer_dir)
    if enc.kind == "mistral3":
        return _mistral3_factory(enc, vocab_size, tokenizer_dir)
    if enc.kind == "clip":
        vocab, _ = clip_vocab_and_merges()
        # eos_token_id != 2: CLIP pools at the first <|endoftext|>, as real SD3 encoders
        # do.
        clip_config = CLIPTextConfig(
            **enc.config,
            vocab_size=vocab_size,
            bos_token_id=vocab[CLIP_BOS],
            eos_token_id=vocab[CLIP_EOS],
            pad_token_id=vocab[CLIP_EOS],
        )
        return lambda: CLIPTextModelWithProjection(clip_config)
    # T5's ids are fixed by the tokenizer layout: <pad>=0, </s>=1; decoding starts from
    # <pad>.
    t5_config = T5Config(
        **enc.config,
        vocab_size=vocab_size,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return lambda: T5EncoderModel(t5_config)


def _qwen2_5_vl_factory(
    enc: TextEncoder, vocab_size: int, tokenizer_dir: Path
) -> Callable[[], Any]:
    """Qwen2.5-VL with the special token ids of the tokenizer just written (the vision
    tokens the edit pipeline's processor inserts; end of text as padding)."""
    from transformers import (
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
    )

    ids = AutoTokenizer.from_pretrained(str(tokenizer_dir)).convert_tokens_to_ids
    text = {
        **enc.config["text_config"],
        "vocab_size": vocab_size,
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
    }
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=enc.config["vision_config"],
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    return lambda: Qwen2_5_VLForConditionalGeneration(config)


def _qwen3_factory(
    enc: TextEncoder, vocab_size: int, tokenizer_dir: Path
) -> Callable[[], Any]:
    """Qwen3 as a bare model (Z-Image reads its hidden states) or with its LM head
    (FLUX.2-klein's class)."""
    import transformers
    from transformers import AutoTokenizer, Qwen3Config

    ids = AutoTokenizer.from_pretrained(str(tokenizer_dir)).convert_tokens_to_ids
    config = Qwen3Config(
        **enc.config,
        vocab_size=vocab_size,
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
    )
    model_class = getattr(transformers, ENCODER_CLASSES[enc.kind][0])
    return lambda: model_class(config)


def _mistral3_factory(
    enc: TextEncoder, vocab_size: int, tokenizer_dir: Path
) -> Callable[[], Any]:
    """Mistral3 (text model and Pixtral vision tower) with the tokenizer's special
    ids."""
    from transformers import (
        AutoTokenizer,
        Mistral3Config,
        Mistral3ForConditionalGeneration,
    )

    ids = AutoTokenizer.from_pretrained(str(tokenizer_dir)).convert_tokens_to_ids
    text = {
        **enc.config["text_config"],
        "vocab_size": vocab_size,
        "bos_token_id": ids("<s>"),
        "eos_token_id": ids("</s>"),
        "pad_token_id": ids("<pad>"),
    }
    config = Mistral3Config(
        text_config=text,
        vision_config=enc.config["vision_config"],
        image_token_index=ids("[IMG]"),
        spatial_merge_size=enc.config["spatial_merge_size"],
        multimodal_projector_bias=enc.config["multimodal_projector_bias"],
    )
    return lambda: Mistral3ForConditionalGeneration(config)
