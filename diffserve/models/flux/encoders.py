"""Prompt encoding with FLUX's two text encoders: CLIP (pooled vector) and T5 (token
sequence)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from diffserve.errors import ModelLoadError
from diffserve.layers.linear.quantized import QuantizationResult, quantize_linears
from diffserve.logging import get_logger
from diffserve.models.loader import strict_from_pretrained
from diffserve.models.text_encoder_file import load_text_encoder

logger = get_logger(__name__)


def _load(
    cls: Any,
    root: Path,
    component: str,
    weights_files: Mapping[str, str],
    dtype: torch.dtype,
) -> Any:
    """``component`` from its folder, or with its folder's config and the single file
    ``weights_files`` names."""
    if component in weights_files:
        return load_text_encoder(
            cls, root / component, component, weights_files[component], dtype=dtype
        )
    return strict_from_pretrained(cls, root / component, dtype=dtype)


class TextEncoders:
    """CLIP ``pooler_output`` and T5 last hidden state, tokenized exactly as diffusers'
    FluxPipeline does (CLIP padded/truncated to its 77-token window, T5 to
    ``max_sequence_length``).

    ``per_prompt`` (the stage's ``batch_invariant``): every prompt is encoded in its own
    call, so its states are the same whichever prompts share the batch (batched encoder
    GEMMs sum in another order)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: torch.dtype,
        device: torch.device,
        per_prompt: bool = True,
        weights_files: Mapping[str, str] | None = None,
    ) -> None:
        from transformers import AutoTokenizer, CLIPTextModel, T5EncoderModel

        root = Path(model_dir)
        try:
            self.clip_tokenizer = AutoTokenizer.from_pretrained(str(root / "tokenizer"))
            self.t5_tokenizer = AutoTokenizer.from_pretrained(str(root / "tokenizer_2"))
            # use_safetensors=True: a directory holding only pytorch_model.bin is
            # refused instead of unpickled, so a model directory can never run code
            # through the text encoders.
            files = weights_files or {}
            self.clip = (
                _load(CLIPTextModel, root, "text_encoder", files, dtype)
                .to(device)
                .eval()
            )
            self.t5 = (
                _load(T5EncoderModel, root, "text_encoder_2", files, dtype)
                .to(device)
                .eval()
            )
        except (OSError, ValueError) as exc:
            raise ModelLoadError(
                f"cannot load the text encoders from {root}: {exc}"
            ) from exc
        self.device = device
        self.dtype = dtype
        self.per_prompt = per_prompt
        self.clip_max_length = int(
            getattr(self.clip_tokenizer, "model_max_length", 77) or 77
        )
        # Tokenizers without a limit report a huge sentinel.
        if self.clip_max_length > 10_000:
            self.clip_max_length = 77
        self._warned: set[str] = set()

    def t5_window_exceeded(self, prompt: str, max_sequence_length: int) -> bool:
        """Whether T5 truncates ``prompt`` at ``max_sequence_length`` tokens (counting
        the end token)."""
        return len(self.t5_tokenizer(prompt).input_ids) > max_sequence_length

    def modules(self) -> dict[str, torch.nn.Module]:
        """The encoders by component name (``text_encoder``: CLIP, ``text_encoder_2``:
        T5)."""
        return {"text_encoder": self.clip, "text_encoder_2": self.t5}

    def quantize(self, method: str) -> dict[str, QuantizationResult]:
        """Quantize both encoders' Linear layers with ``method`` (the stage's
        ``text_encoder_quantization``)."""
        return {
            name: quantize_linears(module, method)
            for name, module in self.modules().items()
        }

    def encode(
        self, prompts: list[str], max_sequence_length: int
    ) -> tuple[Tensor, Tensor]:
        """Return ``(t5 [B, max_sequence_length, D_t5], pooled [B, D_clip])`` for
        ``prompts``."""
        for prompt in prompts:
            if self.t5_window_exceeded(prompt, max_sequence_length):
                # Warn once per pipeline and never echo the prompt: it may be private.
                self._warn_once(
                    "t5",
                    f"a prompt is longer than the T5 window of {max_sequence_length} "
                    "tokens "
                    "and was truncated (raise max_sequence_length, up to "
                    "the model's window, or shorten it)",
                )
            if len(self.clip_tokenizer(prompt).input_ids) > self.clip_max_length:
                self._warn_once(
                    "clip",
                    f"a prompt is longer than CLIP's {self.clip_max_length}-token "
                    "window; "
                    "the pooled CLIP embedding sees only its beginning",
                )
        clip_ids = self.clip_tokenizer(
            prompts,
            padding="max_length",
            max_length=self.clip_max_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids.to(self.device)
        t5_ids = self.t5_tokenizer(
            prompts,
            padding="max_length",
            max_length=max_sequence_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids.to(self.device)
        groups = (
            (clip_ids.split(1), t5_ids.split(1))
            if self.per_prompt
            else ((clip_ids,), (t5_ids,))
        )
        pooled = torch.cat(
            [
                self.clip(ids, output_hidden_states=False).pooler_output
                for ids in groups[0]
            ]
        )
        sequence = torch.cat(
            [self.t5(ids, output_hidden_states=False)[0] for ids in groups[1]]
        )
        return sequence.to(self.dtype), pooled.to(self.dtype)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)
