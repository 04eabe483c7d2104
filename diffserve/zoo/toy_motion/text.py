"""toy-motion's frozen text encoder: the tiny models' UMT5, random and seeded, whose
relative-position biases are set so that each of its heads looks at one neighbour, and
whose tokenizer holds each grammar word as one token.

Why the biases: Wan's transformer reads the prompt only through cross-attention, which
has no positions of its own, so a token's role must be in its encoding. A random UMT5's
relative biases are near zero, its attention near uniform, and "red" encodes the same
wherever it stands (cosine 0.997 between "red" as the object's colour and as the
background's, measured): the prompt is a bag of words and the object's and background's
colours are indistinguishable (a model trained on it swapped them). With one head per
neighbour (one and two tokens to either side, on every layer) a word carries its
context: the two "red"s fall to cosine 0.46 while "red" as the object in two different
prompts stays at 0.70. The weights stay a fixed, seeded construction; nothing is
trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffserve.zoo.components import component_seed
from diffserve.zoo.toy_motion.grammar import grammar_corpus
from diffserve.zoo.toy_motion.wan_flow import TEXT_LENGTH, TextBatch, compress_prompts

# Head h of every layer attends to the token at this offset.
NEIGHBOUR_OFFSETS = (-1, 1, -2, 2)
# Its logit bias there (0 elsewhere): e^8 ~ 3000 against the other tokens.
NEIGHBOUR_BIAS = 8.0


def build_text_encoder(out: Path, encoder_config: dict[str, Any], seed: int) -> Any:
    """Write the grammar's tokenizer to ``out / "tokenizer"`` and return the frozen UMT5
    encoder for it."""
    import torch
    from transformers import UMT5Config, UMT5EncoderModel

    from diffserve.zoo.tokenizers import write_t5_tokenizer

    vocab_size = write_t5_tokenizer(out / "tokenizer", grammar_corpus())
    config = UMT5Config(
        **encoder_config,
        vocab_size=vocab_size,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(component_seed(seed, "text_encoder"))
        encoder = UMT5EncoderModel(config).eval().requires_grad_(False)
    attend_to_neighbours(encoder)
    return encoder


def attend_to_neighbours(encoder: Any) -> None:
    """Set every layer's relative-position bias so that head h attends to the token
    ``NEIGHBOUR_OFFSETS[h]`` away (heads past the offsets keep no bias: uniform
    attention)."""
    import torch

    with torch.no_grad():
        for block in encoder.encoder.block:
            attention = block.layer[0].SelfAttention
            table = attention.relative_attention_bias.weight  # [buckets, heads]
            table.zero_()
            for head, offset in enumerate(NEIGHBOUR_OFFSETS[: table.shape[1]]):
                bucket = int(attention._relative_position_bucket(torch.tensor(offset)))
                table[bucket, head] = NEIGHBOUR_BIAS


def encode_prompts(out: Path, encoder: Any, prompts: list[str]) -> TextBatch:
    """Every prompt as WanPipeline encodes it (its real tokens through UMT5, the rest of
    the 512 zeros), in ``wan_flow``'s compressed form."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    ids = tokenizer(
        prompts,
        padding="longest",
        max_length=TEXT_LENGTH,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        hidden = encoder(ids.input_ids, ids.attention_mask).last_hidden_state
    return compress_prompts(hidden, ids.attention_mask.sum(1).tolist())
