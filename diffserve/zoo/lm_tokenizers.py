"""Hermetic tokenizers for the tiny models whose text encoder is a language model:
GPT-2-style byte-level BPE with Qwen's specials (Qwen-Image, Z-Image, FLUX.2-klein; a
chat template for the Qwen3 encoders), or with Mistral's and a Pixtral processor around
it (FLUX.2-dev).

Qwen2's vocabulary marks a word's leading space with ``Ġ`` (no CLIP-style ``</w>``) and
carries the chat and vision special tokens that Qwen-Image's pipelines write into their
prompt templates (``<|im_start|>``, ``<|vision_start|>``, ``<|image_pad|>``...). The
merges are computed here, deterministically, until every word of the corpus is one
token: then QwenImagePipeline's system prompt tokenizes to exactly the 34 tokens that
its ``prompt_template_encode_start_idx`` drops, as the real tokenizer's does, so the
tiny model's text encoder sees the prompt where the real one would. Nothing is
downloaded; transformers' own class writes the files.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from diffserve.zoo.tokenizers import _bytes_to_unicode, _corpus_words, learn_merges

ENDOFTEXT = "<|endoftext|>"
# Qwen2.5-VL's chat and vision specials, in its own order (after <|endoftext|>).
SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
)
MAX_LENGTH = 32768

# The prompt templates of diffusers' Qwen-Image pipelines (their text around the user's
# prompt): their words join the corpus so that each is one token, as in Qwen's real
# vocabulary.
TEMPLATE_TEXT = (
    "system\nDescribe the image by detailing the color, "
    "shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:\nuser\nassistant\n"
    "Describe the key features of the input image (color, "
    "shape, size, texture, objects, background), then "
    "explain how the user's text instruction should alter "
    "or modify the image. Generate a new image that meets "
    "the user's requirements while maintaining consistency "
    "with the original input where appropriate.\n"
    "Picture 1: Picture 2: Picture 3:"
)
# Qwen2's pre-tokenizer, restricted to ASCII: contractions, words with one optional
# leading non-letter, single digits, punctuation runs, newlines, spaces.
_PRETOKENIZE = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| "
    r"?[^\sA-Za-z0-9]+[\r\n]*|"
    r"\s*[\r\n]+|\s+"
)


def qwen_vocab_and_merges(
    extra_corpus: str = "",
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Bytes, then merges (the most frequent adjacent pair first, ties by text) until
    every pre-tokenized word of the corpus is a single token."""
    byte_to_char = _bytes_to_unicode()
    text = " ".join(_corpus_words(extra_corpus)) + "\n" + TEMPLATE_TEXT
    words: Counter[tuple[str, ...]] = Counter(
        tuple(byte_to_char[b] for b in piece.encode("utf-8"))
        for piece in _PRETOKENIZE.findall(text)
    )
    merges = learn_merges(words)
    tokens = [ch for _, ch in sorted(byte_to_char.items())] + [a + b for a, b in merges]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(tokens))}
    return vocab, merges


def write_qwen_tokenizer(
    out_dir: Path, extra_corpus: str = "", chat_template: str | None = None
) -> int:
    """Write a Qwen2 tokenizer (tokenizer.json) to ``out_dir``; returns the vocabulary
    size with the specials."""
    tokenizer = _bpe_tokenizer(
        extra_corpus, eos=ENDOFTEXT, pad=ENDOFTEXT, specials=SPECIAL_TOKENS
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(out_dir))
    return len(tokenizer)


def _bpe_tokenizer(
    extra_corpus: str,
    *,
    eos: str,
    pad: str,
    specials: tuple[str, ...],
    bos: str | None = None,
    unk: str | None = None,
) -> Any:
    from transformers import Qwen2TokenizerFast

    vocab, merges = qwen_vocab_and_merges(extra_corpus)
    tokenizer = Qwen2TokenizerFast(
        vocab=vocab,
        merges=merges,
        unk_token=unk,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        model_max_length=MAX_LENGTH,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(specials)})
    return tokenizer


def write_pixtral_processor(
    out_dir: Path, chat_template: str, specials: tuple[str, ...]
) -> int:
    """A Pixtral processor directory as FLUX.2-dev ships its ``tokenizer/``: a
    byte-level BPE with Mistral's specials and chat template, the Pixtral image
    processor's config (patch 16) and ``processor_config.json``. Written without
    torchvision (which transformers' PixtralProcessor class needs). Returns the
    vocabulary size."""
    import json

    from transformers import PixtralImageProcessorPil

    tokenizer = _bpe_tokenizer(
        "", bos="<s>", eos="</s>", pad="<pad>", unk="<unk>", specials=specials
    )
    tokenizer.chat_template = chat_template
    tokenizer.add_bos_token = False  # the chat template writes it
    tokenizer.save_pretrained(str(out_dir))
    PixtralImageProcessorPil().save_pretrained(str(out_dir))
    config_path = out_dir / "preprocessor_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(
        image_processor_type="PixtralImageProcessor", processor_class="PixtralProcessor"
    )
    config_path.write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    (out_dir / "processor_config.json").write_text(
        json.dumps(
            {
                "image_break_token": "[IMG_BREAK]",
                "image_end_token": "[IMG_END]",
                "image_token": "[IMG]",
                "patch_size": 16,
                "processor_class": "PixtralProcessor",
                "spatial_merge_size": 2,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n",
        encoding="utf-8",
    )
    return len(tokenizer)


def write_vl_processor(directory: Path, tokenizer_dir: Path) -> None:
    """A Qwen2-VL processor directory as Qwen-Image-Edit checkpoints ship it
    (``processor/``): the image processor's config (patch 14, merge 2, CLIP's
    normalisation) and the tokenizer's files. Written through the image processor's PIL
    backend (no torchvision), under the class names real checkpoints carry."""
    import json

    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    directory.mkdir(parents=True, exist_ok=True)
    Qwen2VLImageProcessorPil().save_pretrained(str(directory))
    AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(directory))
    config_path = directory / "preprocessor_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(
        image_processor_type="Qwen2VLImageProcessor", processor_class="Qwen2VLProcessor"
    )
    config_path.write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
