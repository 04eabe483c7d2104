"""A generic family's text encoding through the exact conditioning cache
(``models/conditioning_cache.py``), where the registry names the pipeline method that
encodes a batch of prompts (``GenericPath.prompt_encoder``; Qwen-Image-2.1's
``_get_qwen_prompt_embeds``).

That method takes a list of prompts and returns tensors ``[B, L, ...]`` zero-padded on
the right (embeddings, their mask and the family's own extras). Here each prompt is
looked up alone; a miss is encoded alone and kept, so a hit holds exactly what encoding
that prompt alone gives, and the rows are padded and stacked as the method itself does.
A call this cannot key by text (a condition image's vision tokens, an unexpected
argument) goes to the method unchanged, uncached. Each request is noted ``hit`` (every
text it needed came from the cache), ``miss`` or ``off`` (it opted out, or the cache is
off) until its result is built, as on the native path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from diffserve.config.stage_sections import ConditioningCacheConfig
from diffserve.models.conditioning_cache import ConditioningCache, encoder_identity
from diffserve.types.attestation import Attestation
from diffserve.types.request import GenerationRequest

# Components whose files decide the encoding (weights, tokenizer, processor).
ENCODER_COMPONENTS = ("text_encoder", "tokenizer", "processor")


def pad_rows(rows: Sequence[Sequence[torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """Per-prompt outputs (each tensor ``[1, L_i, ...]``) as one batch: each zero-padded
    on the right along dim 1 to the longest, then stacked."""
    stacked = []
    for parts in zip(*rows, strict=True):
        length = max(p.shape[1] for p in parts)
        stacked.append(
            torch.cat(
                [
                    torch.cat(
                        [p, p.new_zeros((1, length - p.shape[1], *p.shape[2:]))], dim=1
                    )
                    for p in parts
                ]
            )
        )
    return tuple(stacked)


class CachedPromptEncoder:
    """Replaces ``pipe.<method>`` with a cached one. ``rows`` is the running batch's
    request of each prompt row (set before each call of the pipeline)."""

    def __init__(
        self,
        pipe: Any,
        method: str,
        config: ConditioningCacheConfig,
        root: Path,
        *settings: object,
    ) -> None:
        files = [
            path
            for name in ENCODER_COMPONENTS
            for path in sorted((root / name).glob("*"))
            if path.is_file()
        ]
        self.cache = ConditioningCache(
            config.max_bytes, config.max_entries, encoder_identity(files, *settings)
        )
        self.encode_batch: Callable[..., Any] = getattr(pipe, method)
        self.rows: list[GenerationRequest] = []
        self._outcomes: dict[str, str] = {}
        setattr(pipe, method, self.encode)

    def encode(
        self, prompt: Any, image: Any = None, device: Any = None, *args: Any, **kw: Any
    ) -> Any:
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if image is not None or args or kw or len(prompts) != len(self.rows):
            for request in self.rows:
                self._note(request, "off")
            return self.encode_batch(prompt, image, device, *args, **kw)
        found: list[Sequence[torch.Tensor]] = []
        for text, request in zip(prompts, self.rows, strict=True):
            use = self.cache.enabled and request.conditioning_cache
            # The whole prompt is encoded (no window): the text alone is the key.
            key = self.cache.key(text, 0)
            row = self.cache.get(key) if use else None
            self._note(request, "off" if not use else "hit" if row else "miss")
            if row is None:
                row = tuple(self.encode_batch([text], None, device))
                if use:
                    self.cache.put(key, row)
            found.append(row)
        return pad_rows(found)

    def attest(self, request_id: str) -> Attestation:
        """The request's ``conditioning_cache`` (forgotten once asked) and the cache's
        ``conditioning_cache_state``."""
        return Attestation(
            conditioning_cache=self._outcomes.pop(request_id, "off"),
            conditioning_cache_state=asdict(self.cache.state()),
        )

    def _note(self, request: GenerationRequest, outcome: str) -> None:
        # Encoded twice (CFG's negative prompt too): a hit only if both were.
        if self._outcomes.get(request.request_id) in (None, "hit"):
            self._outcomes[request.request_id] = outcome

    def start(self, rows: list[GenerationRequest]) -> None:
        """A batch begins: its request per prompt row (what a failed batch noted is
        dropped)."""
        self.rows, self._outcomes = rows, {}
