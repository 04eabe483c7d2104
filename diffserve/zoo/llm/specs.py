"""The small language models' shapes: Qwen3 (dense) and Qwen3-MoE causal LMs, and their
chat format.

Sized for vLLM's CPU backend as well as transformers: head_dim 32 (the CPU attention
kernels take no smaller heads), grouped-query attention (2 query heads on 1 key/value
head, as Qwen3's GQA), tied embeddings and a 1024-token context. The token ids
(vocabulary size, end of turn, padding) come from the tokenizer the builder writes, so
they are filled in there (``model_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diffserve.errors import ConfigError

__all__ = [
    "CHAT_TEMPLATE",
    "END_OF_TURN",
    "LLM_SPECS",
    "TOY_PROMPTER_SPEC",
    "LlmSpec",
    "get_llm_spec",
]

# Qwen's chat format without its tool or thinking branches: each message as
# <|im_start|>{role}\n{content}<|im_end|>\n, then <|im_start|>assistant\n for the reply.
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The models' eos: a reply ends where the chat template closes a turn.
END_OF_TURN = "<|im_end|>"

_QWEN3: dict[str, Any] = {
    "hidden_size": 64,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class LlmSpec:
    """One model kind: transformers' config and model class names, and the config's
    shape."""

    name: str
    description: str
    config_class: str
    model_class: str
    config: dict[str, Any] = field(default_factory=dict)

    def model_config(
        self, *, vocab_size: int, eos_token_id: int, pad_token_id: int
    ) -> dict[str, Any]:
        """The config's arguments with the tokenizer's ids (``<|endoftext|>`` is both
        bos and pad, as in Qwen)."""
        return {
            **self.config,
            "vocab_size": vocab_size,
            "eos_token_id": eos_token_id,
            "pad_token_id": pad_token_id,
            "bos_token_id": pad_token_id,
        }


LLM_SPECS: dict[str, LlmSpec] = {
    spec.name: spec
    for spec in (
        LlmSpec(
            "tiny-qwen3",
            "tiny random Qwen3 causal LM (2 layers, hidden 64)",
            "Qwen3Config",
            "Qwen3ForCausalLM",
            _QWEN3,
        ),
        # Every layer sparse (mlp_only_layers empty), 2 of 4 experts per token with
        # normalised top-k weights, as Qwen3-30B-A3B routes.
        LlmSpec(
            "tiny-qwen3-moe",
            "tiny random Qwen3-MoE causal LM (2 layers, 4 experts, 2 per token)",
            "Qwen3MoeConfig",
            "Qwen3MoeForCausalLM",
            {
                **_QWEN3,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "mlp_only_layers": [],
                "decoder_sparse_step": 1,
                "norm_topk_prob": True,
            },
        ),
    )
}
# The trained toy prompter has tiny-qwen3's shape: the task (copy the named words, fill
# in two defaults) needs no more, and the shipped file stays well under a megabyte.
TOY_PROMPTER_SPEC = LlmSpec(
    "toy-prompter",
    "tiny Qwen3 trained on CPU to expand short prompts into the toy models' grammars",
    "Qwen3Config",
    "Qwen3ForCausalLM",
    _QWEN3,
)


def get_llm_spec(kind: str) -> LlmSpec:
    """The spec of a random-weight kind; ConfigError naming the kinds for any other."""
    try:
        return LLM_SPECS[kind]
    except KeyError:
        raise ConfigError(
            f"unknown language model kind {kind!r}",
            path="kind",
            hint=f"choose from: {', '.join(LLM_SPECS)}",
        ) from None
