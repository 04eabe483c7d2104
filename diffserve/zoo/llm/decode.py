"""The toy prompter's input, and greedy expansion of short prompts with transformers.

The model reads exactly the chat template's rendering of the system prompt and the
user's short prompt with the assistant's turn opened (``chat_prompt``); its reply is the
full prompt followed by ``<|im_end|>``. What the trainer scores and what the tests check
go through ``greedy_expand``: transformers' ``generate`` with ``do_sample=False`` on
left-padded batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diffserve.zoo.llm.prompt_grammar import SYSTEM_PROMPT

__all__ = ["MAX_NEW_TOKENS", "chat_prompt", "greedy_expand", "load_llm"]

# The longest expansion is 9 words (toy-motion's grammar), each one token, then
# <|im_end|>; a little slack shows a model that does not stop as a wrong answer rather
# than a cut-off right one.
MAX_NEW_TOKENS = 16


def chat_prompt(tokenizer: Any, short: str) -> str:
    """The model's input for ``short``: the chat template over the system prompt and
    ``short``, reply opened."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": short},
    ]
    text: str = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return text


def load_llm(model_dir: Path | str) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) of a causal-LM directory, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32
    ).eval()
    return model, AutoTokenizer.from_pretrained(str(model_dir))


def greedy_expand(
    model: Any,
    tokenizer: Any,
    shorts: Sequence[str],
    *,
    batch_size: int = 256,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> list[str]:
    """The model's greedy reply to each short prompt (special tokens dropped),
    ``batch_size`` prompts at a time."""
    import torch

    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # a batch's replies all start at its last column
    try:
        replies: list[str] = []
        for start in range(0, len(shorts), batch_size):
            batch = tokenizer(
                [chat_prompt(tokenizer, s) for s in shorts[start : start + batch_size]],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            )
            with torch.no_grad():
                out = model.generate(
                    **batch,
                    do_sample=False,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                )
            new = out[:, batch["input_ids"].shape[1] :]
            replies += tokenizer.batch_decode(new, skip_special_tokens=True)
        return replies
    finally:
        tokenizer.padding_side = side
