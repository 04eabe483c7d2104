"""Build the hermetic, random-weight LTX-2 pipeline (``tiny-ltx2``): text to video with
its audio track.

The builders' contract (``zoo/generic.py``): a diffusers-layout directory that plain
``diffusers.LTX2Pipeline.from_pretrained`` reads and runs, every weight from a
per-component seed, byte-identical rebuilds, safetensors only, nothing downloaded,
built in a staging directory and renamed into place when complete. The Gemma tokenizer
is made here (``write_gemma_tokenizer``): a byte-fallback BPE laid out like Gemma's
(its specials at Gemma's ids, ``<0xNN>`` byte tokens, ``▁`` for spaces, a ``<bos>``
prefix, left padding) with merges learnt deterministically from the zoo's corpus. The
configs live in ``ltx2_specs``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffserve.errors import ConfigError
from diffserve.logging import get_logger
from diffserve.zoo import ltx2_specs as specs
from diffserve.zoo.components import MARKER_FILE, save_components, write_json
from diffserve.zoo.publish import build_seeded
from diffserve.zoo.tokenizers import _corpus_words, learn_merges

__all__ = [
    "BUILDER_VERSION",
    "LTX2_KINDS",
    "build_ltx2_model",
    "gemma_vocab_and_merges",
    "write_gemma_tokenizer",
]

logger = get_logger(__name__)

# Bump when the files a build writes change (recorded in the marker file).
BUILDER_VERSION = 1
LTX2_KINDS: dict[str, str] = {
    "tiny-ltx2": "LTX-2-shaped text-to-video-with-audio model for tests "
    "(24 kHz stereo audio; seconds to build)"
}

# Gemma's specials, at Gemma's own ids (0-4); the turn and image markers follow (105,
# 106, 255999, 256000 and 262144 in the real vocabulary). Gemma3ForConditionalGeneration
# needs the image ids; the chat markers keep prompts with them single tokens.
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
GEMMA_EXTRA_SPECIALS = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
_SPACE = "\u2581"  # Gemma's normalizer writes spaces as this


def build_ltx2_model(
    kind: str, out_dir: Path | str, *, seed: int = 0, force: bool = False
) -> Path:
    """Write a random-weight LTX-2 pipeline of ``kind`` (one of LTX2_KINDS) to
    ``out_dir``; return its path.

    An existing non-empty ``out_dir`` is an error unless ``force`` is set, and even then
    only a previous model directory (one with ``model_index.json``) is replaced. Raises
    ConfigError for every bad argument.
    """
    if kind not in LTX2_KINDS:
        raise ConfigError(
            f"unknown model {kind!r}",
            path="model",
            hint=f"choose one of: {', '.join(LTX2_KINDS)}",
        )
    return build_seeded(
        kind,
        out_dir,
        seed,
        lambda staging, seed: _write_pipeline(kind, staging, seed=seed),
        force=force,
    )


def gemma_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Gemma's layout: specials, the 256 byte-fallback tokens, printable ASCII and
    ``▁``, then merges (most frequent pair first, ties by text: ``learn_merges``) until
    every ``▁word`` of the corpus is one token, as common words are in Gemma's."""
    words: Counter[tuple[str, ...]] = Counter(
        (_SPACE, *word) for word in _corpus_words()
    )
    merges = learn_merges(words)
    tokens = [
        *GEMMA_SPECIALS,
        *GEMMA_EXTRA_SPECIALS,
        *(f"<0x{b:02X}>" for b in range(256)),
        *(chr(c) for c in range(ord("!"), ord("~") + 1)),
        _SPACE,
        *(a + b for a, b in merges),
    ]
    return {token: i for i, token in enumerate(dict.fromkeys(tokens))}, merges


def write_gemma_tokenizer(out_dir: Path) -> int:
    """Write a Gemma tokenizer (tokenizer.json + tokenizer_config.json) to ``out_dir``;
    returns the vocabulary size. Through transformers' own GemmaTokenizer, so the
    installed transformers reads it back; any text tokenizes (byte fallback)."""
    from transformers import GemmaTokenizer

    vocab, merges = gemma_vocab_and_merges()
    tokenizer = GemmaTokenizer(
        vocab=vocab,
        merges=merges,
        # As Gemma's own tokenizer: a <bos> prefix, no <eos>.
        add_bos_token=True,
        add_eos_token=False,
        # The pipeline pads every prompt to its max_sequence_length (1024).
        model_max_length=specs.MAX_SEQUENCE_LENGTH,
    )
    tokenizer.add_special_tokens(
        {"additional_special_tokens": list(GEMMA_EXTRA_SPECIALS)}
    )
    tokenizer.save_pretrained(str(out_dir))
    return len(tokenizer)


def _write_pipeline(kind: str, out: Path, *, seed: int) -> None:
    import diffusers
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    vocab_size = write_gemma_tokenizer(out / "tokenizer")
    FlowMatchEulerDiscreteScheduler(**specs.SCHEDULER_CONFIG).save_pretrained(
        str(out / "scheduler")
    )
    factories: dict[str, Callable[[], Any]] = {
        "text_encoder": _gemma3_factory(vocab_size, out / "tokenizer"),
        "connectors": lambda: LTX2TextConnectors(**specs.CONNECTORS_CONFIG),
        "transformer": lambda: LTX2VideoTransformer3DModel(**specs.TRANSFORMER_CONFIG),
        "vae": lambda: AutoencoderKLLTX2Video(**specs.VIDEO_VAE_CONFIG),
        "audio_vae": lambda: AutoencoderKLLTX2Audio(**specs.AUDIO_VAE_CONFIG),
        "vocoder": lambda: LTX2Vocoder(**specs.VOCODER_CONFIG),
    }
    save_components(factories, out, seed)
    write_json(
        out / "model_index.json",
        {**specs.MODEL_INDEX, "_diffusers_version": diffusers.__version__},
    )
    write_json(
        out / MARKER_FILE,
        {
            "builder_version": BUILDER_VERSION,
            "kind": kind,
            "description": LTX2_KINDS[kind],
            "pipeline": specs.MODEL_INDEX["_class_name"],
            "seed": seed,
            "random_weights": True,
        },
    )


def _gemma3_factory(vocab_size: int, tokenizer_dir: Path) -> Callable[[], Any]:
    """Gemma3ForConditionalGeneration (the class LTX-2 ships) with the special ids of
    the tokenizer just written."""
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration

    ids = AutoTokenizer.from_pretrained(str(tokenizer_dir)).convert_tokens_to_ids
    base = specs.gemma3_config()
    text = {
        **base["text_config"],
        "vocab_size": vocab_size,
        "pad_token_id": ids("<pad>"),
        "bos_token_id": ids("<bos>"),
        # Gemma-3-it ends a turn with <end_of_turn> (106 real), its eos id.
        "eos_token_id": ids("<end_of_turn>"),
    }
    config = Gemma3Config(
        text_config=text,
        vision_config=base["vision_config"],
        mm_tokens_per_image=base["mm_tokens_per_image"],
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
    )
    return lambda: Gemma3ForConditionalGeneration(config)
