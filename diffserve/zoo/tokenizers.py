"""Hermetic tokenizers for the tiny FLUX models: a CLIP byte-level BPE and a T5 Unigram.

Both vocabularies are computed here from a small built-in corpus with fully
deterministic rules (counts, ties broken by the token text), never with the
``tokenizers`` trainers: the Unigram trainer is not reproducible, and a byte-identical
rebuild is part of the builder's contract. Nothing is downloaded. The files are written
by transformers' own tokenizer classes so that the installed transformers is guaranteed
to load what we write.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

from diffserve.logging import get_logger

logger = get_logger(__name__)

# Prompt-like English: enough structure for a few hundred merges / pieces, small enough
# to be instant.
_CORPUS = """
a photo of a cat sitting on a wooden table next to a window with soft morning light
a painting of a red fox in a snowy forest at sunset, oil on canvas, highly detailed
an astronaut riding a horse on the moon, digital art, cinematic lighting, wide angle
a bowl of fresh fruit with apples oranges and grapes on a kitchen counter
a futuristic city skyline at night with neon lights and flying cars, rain, reflections
portrait of an old man with a white beard wearing a hat, black and white photograph
a small house by the lake surrounded by mountains and pine trees in the autumn
a watercolor illustration of a dragon flying over a castle in the clouds
close up of a flower with water drops on the petals, macro photography, \
shallow depth of field
a dog running on the beach with waves in the background, golden hour, sharp focus
a cup of coffee and a book on a table in a cozy cafe, warm colors
a robot reading a newspaper in a park, sunny day, green grass and blue sky
the interior of a modern living room with large windows, plants and a grey sofa
a bird standing on a branch in the rain, minimal style, pastel colors
a sports car driving through the desert, dust clouds, dramatic sky, high quality
a sailing boat on the ocean under a starry sky with the milky way
a girl with a red umbrella walking in the street of an old town at night
a mountain landscape with a river and a waterfall, green valley, early morning fog
a plate of pasta with tomato sauce and basil, food photography, studio light
a cute cartoon bear holding a balloon, simple shapes, bright colors, white background
three people sitting around a fire in the woods, telling stories, warm light
an ancient temple in the jungle covered with vines, mysterious atmosphere, \
volumetric light
"""

CLIP_BOS = "<|startoftext|>"
CLIP_EOS = "<|endoftext|>"
# CLIP-L's context length, which FluxPipeline reads from the tokenizer.
CLIP_MAX_LENGTH = 77
T5_MAX_LENGTH = 512  # FLUX.1-dev's T5 limit
_CLIP_MAX_MERGES = 400
_T5_MAX_PIECES = 700
_T5_MAX_PIECE_LEN = 8
_SPACE = "\u2581"  # SentencePiece's word-boundary marker


def _corpus_words(extra_corpus: str = "") -> list[str]:
    return (_CORPUS + extra_corpus).replace(",", " ,").split()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable character table."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    codes = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes, strict=True)}


def clip_vocab_and_merges(
    extra_corpus: str = "",
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE the way CLIP's vocab is laid out: bytes, bytes+</w>,
    merges, specials.

    Each merge picks the most frequent adjacent pair; ties go to the lexicographically
    smallest pair, so the result never depends on dict/set iteration order or hash
    seeds. ``extra_corpus`` (default none: the tiny models' files stay byte-identical)
    adds text, e.g. a grammar's prompts.
    """
    byte_chars = [ch for _, ch in sorted(_bytes_to_unicode().items())]
    byte_to_char = _bytes_to_unicode()
    words: Counter[tuple[str, ...]] = Counter()
    for word in _corpus_words(extra_corpus):
        chars = [byte_to_char[b] for b in word.lower().encode("utf-8")]
        chars[-1] += "</w>"
        words[tuple(chars)] += 1

    merges = learn_merges(words, _CLIP_MAX_MERGES)

    tokens = (
        byte_chars + [ch + "</w>" for ch in byte_chars] + [a + b for a, b in merges]
    )
    tokens += [CLIP_BOS, CLIP_EOS]
    return {tok: i for i, tok in enumerate(tokens)}, merges


def learn_merges(
    words: Counter[tuple[str, ...]], limit: int | None = None
) -> list[tuple[str, str]]:
    """Byte-pair merges learnt from ``words`` (symbol tuples with counts): the most
    frequent adjacent pair first, ties to the lexicographically smallest, so the result
    never depends on iteration order or hash seeds; up to ``limit`` merges, or (None)
    until every word is one symbol."""
    merges: list[tuple[str, str]] = []
    while limit is None or len(merges) < limit:
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, freq in words.items():
            for pair in zip(symbols, symbols[1:], strict=False):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs.items(), key=lambda item: (-item[1], item[0]))[0]
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for symbols, freq in words.items():
            merged[_merge(symbols, best)] += freq
        words = merged
    return merges


def _merge(symbols: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


def t5_vocab(extra_corpus: str = "") -> list[tuple[str, float]]:
    """A SentencePiece-style Unigram vocab: T5's specials first, then pieces with
    log-prob scores.

    Pieces are substrings of ``▁word`` counted over the corpus; every printable ASCII
    character is included so any ASCII prompt tokenizes without ``<unk>``. Every word of
    ``extra_corpus`` is also kept whole (``▁word``), so a grammar's words are single
    pieces.
    """
    counts: Counter[str] = Counter()
    for word in _corpus_words(extra_corpus):
        text = _SPACE + word
        for start in range(len(text)):
            for end in range(start + 1, min(len(text), start + _T5_MAX_PIECE_LEN) + 1):
                counts[text[start:end]] += 1
    # Keep pieces seen at least twice (or single characters), most frequent first, ties
    # by text.
    ranked = sorted(
        (p for p, c in counts.items() if c >= 2 or len(p) == 1),
        key=lambda p: (-counts[p], p),
    )[:_T5_MAX_PIECES]
    chars = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [_SPACE]
    extra_words = Counter(_SPACE + w for w in extra_corpus.replace(",", " ,").split())
    # Whole words longer than _T5_MAX_PIECE_LEN.
    for piece, count in extra_words.items():
        counts[piece] = max(counts[piece], count)
    ranked += sorted(set(extra_words) - set(ranked))
    seen = set(ranked)
    pieces = ranked + [c for c in chars if c not in seen]
    total = sum(counts.values())
    scored = [(p, math.log(max(counts[p], 0.5) / total)) for p in pieces]
    # Round so the JSON text of each score is short and platform-independent.
    scored = [
        (p, round(s, 6)) for p, s in sorted(scored, key=lambda ps: (-ps[1], ps[0]))
    ]
    return [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + scored


def write_clip_tokenizer(out_dir: Path, extra_corpus: str = "") -> int:
    """Write ``tokenizer/`` (tokenizer.json + legacy vocab.json/merges.txt). Returns the
    vocab size."""
    from transformers import CLIPTokenizer

    vocab, merges = clip_vocab_and_merges(extra_corpus)
    tok = CLIPTokenizer(
        vocab=dict(vocab), merges=list(merges), model_max_length=CLIP_MAX_LENGTH
    )
    tok.save_pretrained(str(out_dir))
    # The slow-tokenizer files too, so transformers 4.x's CLIPTokenizer can read the
    # directory.
    (out_dir / "vocab.json").write_text(
        json.dumps(vocab, ensure_ascii=False, sort_keys=True, indent=2) + "\n",
        encoding="utf-8",
    )
    merges_text = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    (out_dir / "merges.txt").write_text(merges_text, encoding="utf-8")
    return len(vocab)


def write_t5_tokenizer(out_dir: Path, extra_corpus: str = "") -> int:
    """Write ``tokenizer_2/`` (a Unigram tokenizer.json). Returns the vocab size."""
    from transformers import T5Tokenizer

    vocab = t5_vocab(extra_corpus)
    # extra_ids=0: FLUX never uses T5's span-corruption sentinels.
    tok = T5Tokenizer(vocab=list(vocab), extra_ids=0, model_max_length=T5_MAX_LENGTH)
    tok.save_pretrained(str(out_dir))
    return len(vocab)
