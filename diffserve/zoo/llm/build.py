"""Build hermetic, random-weight language models (``tiny-qwen3``, ``tiny-qwen3-moe``) in
Hugging Face's causal-LM layout (``config.json``, ``model.safetensors``,
``generation_config.json``, the tokenizer's files with its chat template), which
transformers' ``AutoModelForCausalLM`` and vLLM load as they are.

The builders' contract (``zoo/generic.py``): weights from a seeded generator,
byte-identical rebuilds, safetensors only, a locally made tokenizer (the toy prompt
grammar's words and its system prompt are single tokens), nothing downloaded, built in a
staging directory and renamed into place when complete. ``config.json`` is the folder's
marker (what a ``force`` rebuild may replace); ``diffserve_model.json`` records the kind
and seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffserve.zoo.components import MARKER_FILE, component_seed, write_json
from diffserve.zoo.llm.prompt_grammar import corpus
from diffserve.zoo.llm.specs import (
    CHAT_TEMPLATE,
    END_OF_TURN,
    LLM_SPECS,
    LlmSpec,
    get_llm_spec,
)
from diffserve.zoo.publish import build_seeded

__all__ = [
    "BUILDER_VERSION",
    "LLM_MARKER",
    "LLM_SPECS",
    "TOY_PROMPTER_ASSET",
    "build_tiny_llm",
    "new_llm",
    "save_llm",
    "toy_prompter_dir",
    "write_tokenizer",
]

BUILDER_VERSION = 1
# what every causal-LM folder holds (a model_index.json is a diffusers pipeline's)
LLM_MARKER = "config.json"
# the trained toy prompter: diffserve/assets/toy-prompter (trained by
# diffserve.zoo.llm.train)
TOY_PROMPTER_ASSET = "toy-prompter"


def build_tiny_llm(
    kind: str, out_dir: Path | str, *, seed: int = 0, force: bool = False
) -> Path:
    """Write a random-weight causal LM of ``kind`` (one of LLM_SPECS) to ``out_dir``;
    return its path.

    An existing non-empty ``out_dir`` is an error unless ``force`` is set, and even then
    only a previous model directory (one with ``config.json``) is replaced. Raises
    ConfigError for every bad argument.
    """
    spec = get_llm_spec(kind)
    return build_seeded(
        kind,
        out_dir,
        seed,
        lambda staging, seed: _write_random(spec, staging, seed),
        force=force,
        marker=LLM_MARKER,
    )


def toy_prompter_dir() -> Path:
    """The trained toy prompter shipped in the package
    (``diffserve/assets/toy-prompter``); a ``ConfigError`` saying how to get it back
    when its files are missing."""
    from diffserve.errors import ConfigError

    path = Path(__file__).resolve().parents[2] / "assets" / TOY_PROMPTER_ASSET
    if not (path / LLM_MARKER).is_file() or not (path / "model.safetensors").is_file():
        raise ConfigError(
            f"the shipped {TOY_PROMPTER_ASSET} model is missing from {path}",
            path="model",
            hint="reinstall diffserve, or train it: diffserve make-model "
            f"{TOY_PROMPTER_ASSET} DIR "
            "--train",
        )
    return path


def write_tokenizer(out: Path) -> Any:
    """Write the Qwen2 tokenizer with the chat template to ``out``; return it as
    transformers loads it back."""
    from transformers import AutoTokenizer

    from diffserve.zoo.lm_tokenizers import write_qwen_tokenizer

    write_qwen_tokenizer(out, corpus(), chat_template=CHAT_TEMPLATE)
    return AutoTokenizer.from_pretrained(str(out))


def new_llm(spec: LlmSpec, tokenizer: Any, seed: int) -> Any:
    """A freshly initialised model of ``spec`` for ``tokenizer``'s ids, its weights
    drawn from ``seed`` alone (the caller's global RNG state is left as it was)."""
    import torch
    import transformers

    config = getattr(transformers, spec.config_class)(
        **spec.model_config(
            vocab_size=len(tokenizer),
            eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TURN),
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(component_seed(seed, spec.name))
        return getattr(transformers, spec.model_class)(config)


def save_llm(model: Any, out: Path) -> None:
    """``model`` as safetensors with its config and generation config (no progress bar
    for one small file)."""
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out), safe_serialization=True)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _write_random(spec: LlmSpec, out: Path, seed: int) -> None:
    tokenizer = write_tokenizer(out)
    save_llm(new_llm(spec, tokenizer, seed).eval(), out)
    write_json(
        out / MARKER_FILE,
        {
            "builder_version": BUILDER_VERSION,
            "kind": spec.name,
            "description": spec.description,
            "seed": seed,
            "random_weights": True,
        },
    )
