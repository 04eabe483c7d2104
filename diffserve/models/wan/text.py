"""Wan's prompt encoding: the UMT5 encoder's last hidden state, tokenized and masked
exactly as diffusers' ``WanPipeline`` does (prompts cleaned of HTML escapes and runs of
whitespace, padded to the request's ``max_sequence_length``, the states past each
prompt's last token zeroed)."""

from __future__ import annotations

import html
import re
from pathlib import Path

import torch
from torch import Tensor

from diffserve.errors import ModelLoadError
from diffserve.logging import get_logger
from diffserve.models.loader import strict_from_pretrained

logger = get_logger(__name__)


def clean_prompt(text: str) -> str:
    """diffusers' ``prompt_clean``: unescape HTML twice, collapse whitespace (and ftfy's
    fixes when installed)."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


class UMT5Text:
    """The tokenizer and UMT5 encoder of a Wan model directory. ``per_prompt`` (the
    stage's ``batch_invariant``): each prompt in its own encoder call, so its states
    never depend on the batch."""

    def __init__(
        self,
        root: Path,
        *,
        dtype: torch.dtype,
        device: torch.device,
        per_prompt: bool = True,
    ) -> None:
        from transformers import AutoTokenizer, UMT5EncoderModel

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(root / "tokenizer"))
            self.encoder = strict_from_pretrained(
                UMT5EncoderModel, root / "text_encoder", dtype=dtype
            ).to(device)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(
                f"cannot load the UMT5 text encoder of {root}: {exc}"
            ) from exc
        self.encoder.eval()
        self.device, self.dtype, self.per_prompt = device, dtype, per_prompt

    @torch.inference_mode()
    def encode(self, prompts: list[str], max_sequence_length: int) -> Tensor:
        """``[B, max_sequence_length, hidden]`` in the stage's dtype, zero past each
        prompt's tokens."""
        tokens = self.tokenizer(
            [clean_prompt(p) for p in prompts],
            padding="max_length",
            max_length=max_sequence_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        ids, mask = (
            tokens.input_ids.to(self.device),
            tokens.attention_mask.to(self.device),
        )
        groups = (
            zip(ids.split(1), mask.split(1), strict=True)
            if self.per_prompt
            else [(ids, mask)]
        )
        states = torch.cat(
            [self.encoder(i, m).last_hidden_state for i, m in groups]
        ).to(self.dtype)
        lengths = mask.gt(0).sum(dim=1)
        keep = (
            torch.arange(max_sequence_length, device=self.device)[None, :]
            < lengths[:, None]
        )
        return states * keep[..., None].to(states.dtype)
