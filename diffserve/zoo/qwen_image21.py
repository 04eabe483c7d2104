"""Build the hermetic, random-weight Qwen-Image-2.1 pipeline (``tiny-qwen-image-21``).

The builders' contract (``zoo/generic.py``): a diffusers-layout directory that plain
``diffusers.QwenImage21Pipeline.from_pretrained(dir)`` reads and runs, laid out as the
real checkpoint is (``processor/``, ``text_encoder/``, ``transformer/``, ``vae/``,
``scheduler/``); every weight from a per-component seed, byte-identical rebuilds,
safetensors only, a tokenizer learned locally (nothing is downloaded), built in a
staging directory and renamed into place when complete. The configs live in
``qwen_image21_specs``.

The real checkpoint's ``processor/`` is a ``Qwen3VLProcessor``, which transformers
builds with a ``Qwen3VLVideoProcessor``, which needs torchvision. The files written
here are the real ones' (image and video processor configs, tokenizer, chat template);
where torchvision is missing the marker file names the component
(``needs_torchvision``) and ``models.generic.vl_processor.load_qwen3_vl_processor``
gives its image-only twin to hand in, as that module does for Qwen2-VL.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffserve.errors import ConfigError
from diffserve.logging import get_logger
from diffserve.registry.processors import (
    QWEN3_VL_PROCESSOR_CLASS,
    TORCHVISION_PROCESSORS,
)
from diffserve.zoo.components import MARKER_FILE, save_components, write_json
from diffserve.zoo.publish import build_seeded
from diffserve.zoo.qwen_image21_specs import (
    QWEN3_VL_CHAT_TEMPLATE,
    QWEN3_VL_IMAGE_PROCESSOR,
    QWEN3_VL_VIDEO_PROCESSOR,
    QWEN_IMAGE21_SCHEDULER_CONFIG,
    QWEN_IMAGE21_TEMPLATE_TEXT,
    QWEN_IMAGE21_VAE_CONFIG,
    SAMPLE_SIGMAS,
    qwen3_vl_config,
    qwen_image21_transformer,
)

__all__ = [
    "BUILDER_VERSION",
    "PIPELINE",
    "PROCESSOR_CLASS",
    "QWEN_IMAGE21_KINDS",
    "build_qwen_image21_model",
    "model_index",
]

logger = get_logger(__name__)

# Bump when the files a build writes change (recorded in the marker file).
BUILDER_VERSION = 1

PIPELINE = "QwenImage21Pipeline"
PROCESSOR_CLASS = QWEN3_VL_PROCESSOR_CLASS
PROCESSOR_NEEDS = TORCHVISION_PROCESSORS[QWEN3_VL_PROCESSOR_CLASS]

QWEN_IMAGE21_KINDS: dict[str, str] = {
    "tiny-qwen-image-21": "~1.2M-parameter Qwen-Image-2.1-shaped model (Qwen3-VL "
    "text encoder, block-causal single-stream DiT with prefix KV cache, RGBA VAE) "
    "for tests and demos (seconds to build)",
    # Benchmarks only (benchmarks/qwen_image21_native.py), not a make-model kind: the
    # real head (128 wide, its RoPE axes) at 8 heads and 6 layers.
    "small-qwen-image-21": "~85M-parameter Qwen-Image-2.1-shaped transformer (the "
    "tiny text encoder and VAE) for benchmarks",
}
# The transformer of each kind (layers, heads, head width).
TRANSFORMER_SIZES: dict[str, dict[str, int]] = {
    "tiny-qwen-image-21": {"layers": 2, "heads": 2, "head_dim": 32},
    "small-qwen-image-21": {"layers": 6, "heads": 8, "head_dim": 128},
}


def model_index() -> dict[str, Any]:
    """model_index.json's entries (without _diffusers_version): the real checkpoint's
    component classes and the pipeline's ``sample_sigmas`` config."""
    return {
        "_class_name": PIPELINE,
        "processor": ["transformers", PROCESSOR_CLASS],
        "sample_sigmas": SAMPLE_SIGMAS,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3VLForConditionalGeneration"],
        "transformer": ["diffusers", "QwenImage21Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage21"],
    }


def build_qwen_image21_model(
    kind: str, out_dir: Path | str, *, seed: int = 0, force: bool = False
) -> Path:
    """Write a random-weight Qwen-Image-2.1 pipeline of ``kind`` (one of
    QWEN_IMAGE21_KINDS) to ``out_dir``; return its path.

    An existing non-empty ``out_dir`` is an error unless ``force`` is set, and even then
    only a previous model directory (one with ``model_index.json``) is replaced. Raises
    ConfigError for every bad argument.
    """
    if kind not in QWEN_IMAGE21_KINDS:
        raise ConfigError(
            f"unknown model {kind!r}",
            path="model",
            hint=f"choose one of: {', '.join(QWEN_IMAGE21_KINDS)}",
        )
    out = build_seeded(
        kind,
        out_dir,
        seed,
        lambda staging, seed: _write_pipeline(kind, staging, seed=seed),
        force=force,
    )
    if importlib.util.find_spec("torchvision") is None:
        # The files are right (the real checkpoint names the same class), but the
        # error a plain load gives here (transformers' placeholder class) names
        # neither the component nor what to hand in.
        logger.warning(
            "%s: plain diffusers cannot load its processor/ (%s) here: %s, which is "
            "not installed; load the pipeline with processor= handed in "
            "(diffserve.models.generic.vl_processor.load_qwen3_vl_processor)",
            kind,
            PROCESSOR_CLASS,
            PROCESSOR_NEEDS,
        )
    return out


def _write_pipeline(kind: str, out: Path, *, seed: int) -> None:
    import diffusers
    from diffusers import (
        AutoencoderKLQwenImage21,
        FlowMatchEulerDiscreteScheduler,
        QwenImage21Transformer2DModel,
    )

    vocab_size = _write_processor(out / "processor")
    FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE21_SCHEDULER_CONFIG).save_pretrained(
        str(out / "scheduler")
    )
    transformer = qwen_image21_transformer(**TRANSFORMER_SIZES[kind])
    factories: dict[str, Callable[[], Any]] = {
        "text_encoder": _text_encoder_factory(vocab_size, out / "processor"),
        "vae": lambda: AutoencoderKLQwenImage21(**QWEN_IMAGE21_VAE_CONFIG),
        "transformer": lambda: QwenImage21Transformer2DModel(**transformer),
    }
    save_components(factories, out, seed)

    write_json(
        out / "model_index.json",
        {**model_index(), "_diffusers_version": diffusers.__version__},
    )
    write_json(
        out / MARKER_FILE,
        {
            "builder_version": BUILDER_VERSION,
            "kind": kind,
            "description": QWEN_IMAGE21_KINDS[kind],
            "pipeline": PIPELINE,
            "seed": seed,
            "random_weights": True,
            # What a plain diffusers load without torchvision must be handed, written
            # whether or not torchvision is here so that the files stay the same
            # everywhere.
            "needs_torchvision": {"processor": PROCESSOR_CLASS},
        },
    )


def _write_processor(directory: Path) -> int:
    """``processor/`` as the real checkpoint ships it: a Qwen2 byte-level BPE with
    Qwen's specials and Qwen3-VL's chat template, the image processor's config (patch
    16, merge 2, [-1, 1] normalisation) and the video processor's; returns the
    vocabulary size."""
    from transformers import Qwen2VLImageProcessorPil

    vocab_size = _write_tokenizer(directory)
    # The PIL backend writes the same keys as the real (torchvision) class; the class
    # names are set to the real file's.
    Qwen2VLImageProcessorPil(**QWEN3_VL_IMAGE_PROCESSOR).save_pretrained(str(directory))
    config_path = directory / "preprocessor_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(
        image_processor_type="Qwen2VLImageProcessorFast",
        processor_class=PROCESSOR_CLASS,
    )
    write_json(config_path, config)
    write_json(directory / "video_preprocessor_config.json", QWEN3_VL_VIDEO_PROCESSOR)
    return vocab_size


@functools.lru_cache(maxsize=1)
def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The shared Qwen BPE (``lm_tokenizers``) over the pipeline's template words, so
    that its system prompt is one token per word and the tokens the pipeline drops
    (``_drop_idx``) are the system block's, as with the real vocabulary. Learned once
    per process: it is most of a build's time, and a build is pure in it."""
    from diffserve.zoo.lm_tokenizers import qwen_vocab_and_merges

    return qwen_vocab_and_merges(QWEN_IMAGE21_TEMPLATE_TEXT)


def _write_tokenizer(directory: Path) -> int:
    """``lm_tokenizers.write_qwen_tokenizer``'s tokenizer with the learned vocabulary
    cached, and Qwen3-VL's end of turn and context length; returns the vocabulary size
    with the specials."""
    from transformers import Qwen2TokenizerFast

    from diffserve.zoo.lm_tokenizers import ENDOFTEXT, SPECIAL_TOKENS

    vocab, merges = _vocab_and_merges()
    tokenizer = Qwen2TokenizerFast(
        vocab=dict(vocab),
        merges=list(merges),
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token=ENDOFTEXT,
        model_max_length=262144,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.chat_template = QWEN3_VL_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(directory))
    return len(tokenizer)


def _text_encoder_factory(vocab_size: int, tokenizer_dir: Path) -> Callable[[], Any]:
    """Qwen3-VL (text model with its LM head, vision tower) with the special token ids
    of the tokenizer just written: the vision tokens the processor inserts, end of turn
    as end of sequence, end of text as padding."""
    from transformers import (
        AutoTokenizer,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    ids = AutoTokenizer.from_pretrained(str(tokenizer_dir)).convert_tokens_to_ids
    spec = qwen3_vl_config()
    text = {
        **spec["text_config"],
        "vocab_size": vocab_size,
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
    }
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=spec["vision_config"],
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,  # real (8B)
    )
    return lambda: Qwen3VLForConditionalGeneration(config)
