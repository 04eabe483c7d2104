"""Wan2.1's flow-matching objective as toy-motion is trained with it, with the prompt's
padding folded away.

WanPipeline encodes a prompt to its real tokens followed by zero vectors up to 512
positions, and cross-attends to all 512 without a mask. The zero vectors are identical,
so they are identical keys and values: attending to them equals attending to one of them
whose logit carries ``log(number of pads)``. Training therefore runs on the real tokens
plus one pad slot and a per-slot additive bias (``TextBatch``), which the
cross-attention processors here add to the logits: exactly the pipeline's attention, at
a fraction of the cost.

The noise level is drawn logit-normal and shifted with the scheduler's ``flow_shift``
(UniPC samples the shifted sigmas); the transformer takes ``1000 * sigma`` as its
timestep and predicts the velocity ``noise - x0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

TEXT_LENGTH = 512  # WanPipeline's max_sequence_length: the window prompts are padded to


@dataclass(frozen=True)
class TextBatch:
    """Prompts as the transformer sees them, compressed: embeddings [B, slots, dim]
    (real tokens, then zeros) and the additive cross-attention bias [B, slots] (0 for a
    token, log(pads) for the first zero slot, -inf for the others)."""

    embeds: Any
    bias: Any

    def take(self, index: Any) -> TextBatch:
        return TextBatch(self.embeds[index], self.bias[index])


def compress_prompts(hidden: Any, lengths: list[int]) -> TextBatch:
    """``hidden`` [P, L, dim], the encoder's output of each prompt's ``lengths[p]`` real
    tokens (padded to L), as a ``TextBatch`` of L + 1 slots."""
    import torch

    count, longest, dim = hidden.shape
    embeds = torch.zeros(count, longest + 1, dim)
    bias = torch.full((count, longest + 1), float("-inf"))
    for p, n in enumerate(lengths):
        embeds[p, :n] = hidden[p, :n]
        bias[p, :n] = 0.0
        bias[p, n] = math.log(TEXT_LENGTH - n)
    return TextBatch(embeds, bias)


class BiasedCrossAttention:
    """Wraps a Wan cross-attention processor to add the batch's text bias to its logits
    (diffusers' Wan block passes cross-attention no mask). ``bias`` is set before each
    forward."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.bias: Any = None

    def __call__(
        self,
        attn: Any,
        hidden_states: Any,
        encoder_hidden_states: Any = None,
        attention_mask: Any = None,
        rotary_emb: Any = None,
    ) -> Any:
        mask = (
            None
            if self.bias is None
            else self.bias[:, None, None, :].to(hidden_states.dtype)
        )
        return self.inner(attn, hidden_states, encoder_hidden_states, mask, rotary_emb)


def bias_cross_attention(transformer: Any) -> list[BiasedCrossAttention]:
    """Install ``BiasedCrossAttention`` on every block's cross-attention; returns them
    (set ``.bias`` on each)."""
    wrapped = []
    for block in transformer.blocks:
        processor = BiasedCrossAttention(block.attn2.processor)
        block.attn2.processor = processor
        wrapped.append(processor)
    return wrapped


def shifted_sigmas(u: Any, shift: float) -> Any:
    """UniPC's flow shift applied to ``u`` in (0, 1): shift * u / (1 + (shift - 1) *
    u)."""
    return shift * u / (1.0 + (shift - 1.0) * u)


def flow_matching_loss(
    model: Any,
    processors: list[BiasedCrossAttention],
    x0: Any,
    text: TextBatch,
    gen: Any,
    *,
    shift: float,
    bf16: bool,
) -> Any:
    """The flow-matching loss on normalized latents ``x0`` [B, 16, F, H, W]."""
    import torch

    noise = torch.randn(x0.shape, generator=gen)
    sigma = shifted_sigmas(torch.sigmoid(torch.randn(len(x0), generator=gen)), shift)
    s = sigma[:, None, None, None, None]
    x_t = (1.0 - s) * x0 + s * noise
    for processor in processors:
        processor.bias = text.bias
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        pred = model(
            hidden_states=x_t,
            timestep=sigma * 1000.0,
            encoder_hidden_states=text.embeds,
            return_dict=False,
        )[0]
    return torch.nn.functional.mse_loss(pred.float(), noise - x0)
