"""Build the hermetic, random-weight HunyuanVideo-1.5 pipeline
(``tiny-hunyuan-video-15``).

The builders' contract (``zoo/generic.py``): a diffusers-layout directory that plain
``diffusers.HunyuanVideo15Pipeline.from_pretrained`` reads and runs, every weight from a
per-component seed, byte-identical rebuilds, safetensors only, tokenizers made locally
(nothing downloaded), built in a staging directory and renamed into place only when
complete. The configs live in ``hunyuan_video15_specs``.

Two text encoders, as in the real checkpoint: a Qwen2.5-VL language model (read through
its chat template, hidden states three from the end, the system turn cropped) and a
ByT5 encoder for the quoted glyph text of a prompt; plus a ``guider/`` component, which
is where the pipeline's classifier-free guidance scale lives.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffserve.errors import ConfigError
from diffserve.logging import get_logger
from diffserve.zoo import hunyuan_video15_specs as specs
from diffserve.zoo.components import MARKER_FILE, save_components, write_json
from diffserve.zoo.publish import build_seeded

__all__ = [
    "BUILDER_VERSION",
    "HUNYUAN_VIDEO15_KINDS",
    "build_hunyuan_video15_model",
    "qwen_vocab_and_merges",
]

logger = get_logger(__name__)

# Bump when the files a build writes change (recorded in the marker file).
BUILDER_VERSION = 1
HUNYUAN_VIDEO15_KINDS: tuple[str, ...] = (specs.KIND,)


def build_hunyuan_video15_model(
    kind: str, out_dir: Path | str, *, seed: int = 0, force: bool = False
) -> Path:
    """Write a random-weight HunyuanVideo-1.5 pipeline of ``kind`` (one of
    ``HUNYUAN_VIDEO15_KINDS``) to ``out_dir``; return its path.

    An existing non-empty ``out_dir`` is an error unless ``force`` is set, and even then
    only a previous model directory (one with ``model_index.json``) is replaced. Raises
    ConfigError for every bad argument.
    """
    if kind not in HUNYUAN_VIDEO15_KINDS:
        raise ConfigError(
            f"unknown model {kind!r}",
            path="model",
            hint=f"choose one of: {', '.join(HUNYUAN_VIDEO15_KINDS)}",
        )
    return build_seeded(kind, out_dir, seed, _write_pipeline, force=force)


def qwen_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The tiny Qwen2 BPE: ``lm_tokenizers``' corpus plus the pipeline's system message
    taken verbatim, merged (deterministically) until every pre-tokenized piece is one
    token.

    A variant of ``lm_tokenizers.qwen_vocab_and_merges`` for two reasons: that one
    splits its extra corpus into words (the system message's runs of spaces would be
    lost), and it keeps a whitespace run whole where Qwen's pre-tokenizer splits off the
    space before a word; this one splits as Qwen does, so the nine-space runs become an
    eight-space token and a one-space one, and the system turn is 108 tokens, as with
    the real tokenizer (``specs.TEMPLATE_CROP_START``).
    """
    from diffserve.zoo.lm_tokenizers import _PRETOKENIZE, TEMPLATE_TEXT
    from diffserve.zoo.tokenizers import _bytes_to_unicode, _corpus_words, learn_merges

    # Qwen2's whitespace rule: ``\s+(?!\S)`` (a run, less the space before a word),
    # then ``\s+``.
    pattern = _PRETOKENIZE.pattern.removesuffix(r"\s+") + r"\s+(?!\S)|\s+"
    byte_to_char = _bytes_to_unicode()
    text = "\n".join((" ".join(_corpus_words()), TEMPLATE_TEXT, specs.SYSTEM_MESSAGE))
    words: Counter[tuple[str, ...]] = Counter(
        tuple(byte_to_char[b] for b in piece.encode("utf-8"))
        for piece in re.findall(pattern, text)
    )
    merges = learn_merges(words)
    tokens = [ch for _, ch in sorted(byte_to_char.items())] + [a + b for a, b in merges]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(tokens))}
    return vocab, merges


def _write_qwen_tokenizer(out_dir: Path) -> dict[str, int]:
    """Write ``tokenizer/`` (Qwen2.5-VL's specials and chat template, right padding as
    the real checkpoint saves it); returns the ids the text encoder's config needs."""
    from transformers import Qwen2TokenizerFast

    from diffserve.zoo.lm_tokenizers import ENDOFTEXT, MAX_LENGTH, SPECIAL_TOKENS

    vocab, merges = qwen_vocab_and_merges()
    tokenizer = Qwen2TokenizerFast(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        model_max_length=MAX_LENGTH,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.chat_template = specs.QWEN2_5_VL_CHAT_TEMPLATE
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(str(out_dir))
    ids = tokenizer.convert_tokens_to_ids
    return {
        "vocab_size": len(tokenizer),
        "bos_token_id": ids(ENDOFTEXT),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids(ENDOFTEXT),
    }


def _write_byt5_tokenizer(out_dir: Path) -> int:
    """Write ``tokenizer_2/``: ByT5's tokenizer is bytes plus three specials and 125
    sentinels, no learnt vocabulary, so it is the real one (less Glyph-SDXL-v2's
    added color and font tokens, which only its own prompts use). Returns the
    vocabulary size."""
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer()
    tokenizer.save_pretrained(str(out_dir))
    return len(tokenizer)


def _write_pipeline(out: Path, seed: int) -> None:
    import diffusers
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Transformer3DModel,
    )
    from diffusers.utils import logging as diffusers_logging
    from transformers import (
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    qwen_ids = _write_qwen_tokenizer(out / "tokenizer")
    byt5_vocab_size = _write_byt5_tokenizer(out / "tokenizer_2")
    qwen_config = Qwen2_5_VLTextConfig(**specs.QWEN_TEXT_CONFIG, **qwen_ids)
    # ByT5's ids are fixed by its layout: <pad>=0, </s>=1; decoding starts from <pad>.
    byt5_config = T5Config(
        **specs.BYT5_CONFIG,
        vocab_size=byt5_vocab_size,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    FlowMatchEulerDiscreteScheduler(**specs.SCHEDULER_CONFIG).save_pretrained(
        str(out / "scheduler")
    )
    # Guiders warn that they are experimental on every construction: noise here.
    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        guider = ClassifierFreeGuidance(**specs.GUIDER_CONFIG)
    finally:
        diffusers_logging.set_verbosity(verbosity)
    guider.save_pretrained(str(out / "guider"))

    factories: dict[str, Callable[[], Any]] = {
        "text_encoder": lambda: Qwen2_5_VLTextModel(qwen_config),
        "text_encoder_2": lambda: T5EncoderModel(byt5_config),
        "vae": lambda: AutoencoderKLHunyuanVideo15(**specs.VAE_CONFIG),
        "transformer": lambda: HunyuanVideo15Transformer3DModel(
            **specs.TRANSFORMER_CONFIG
        ),
    }
    save_components(factories, out, seed)

    write_json(
        out / "model_index.json",
        {**specs.model_index(), "_diffusers_version": diffusers.__version__},
    )
    write_json(
        out / MARKER_FILE,
        {
            "builder_version": BUILDER_VERSION,
            "kind": specs.KIND,
            "description": specs.DESCRIPTION,
            "pipeline": specs.PIPELINE,
            "seed": seed,
            "random_weights": True,
        },
    )
