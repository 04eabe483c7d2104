"""FLUX's text encoding through the exact conditioning cache
(``models/conditioning_cache.py``).

Each request's texts are looked up one by one; the misses go to the encoders together
(one call per prompt with ``batch_invariant``, so a hit holds exactly what encoding that
prompt alone gives) and are stored; the rows come back in request order. A request that
opts out (``conditioning_cache=False``) is always encoded and never stored. What
happened to each request is kept until its result is built: ``hit`` (every text it
needed came from the cache: the encoders did not run for it), ``miss`` or ``off``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor

from diffserve.config.stage_sections import ConditioningCacheConfig
from diffserve.models.conditioning_cache import (
    CacheState,
    ConditioningCache,
    encoder_identity,
)
from diffserve.models.flux.encoders import TextEncoders
from diffserve.types.attestation import Attestation
from diffserve.types.request import GenerationRequest

MAX_PENDING_RESULTS = 4096


class CachedTextEncoders:
    def __init__(
        self, encoders: TextEncoders, config: ConditioningCacheConfig, identity: str
    ) -> None:
        self.encoders = encoders
        self.cache = ConditioningCache(config.max_bytes, config.max_entries, identity)
        # Request id -> hit | miss | off, until its result is built.
        self._results: dict[str, str] = {}

    @classmethod
    def for_model(
        cls,
        encoders: TextEncoders,
        root: Path,
        config: ConditioningCacheConfig,
        components: dict[str, str],
        *settings: object,
    ) -> CachedTextEncoders:
        """The cache of the encoders loaded from ``root`` (single-file components
        included)."""
        files = [
            Path(components[name]) if name in components else path
            for name in ("text_encoder", "text_encoder_2")
            for path in (
                [root / name] if name in components else sorted((root / name).glob("*"))
            )
        ]
        files += [
            path
            for name in ("tokenizer", "tokenizer_2")
            for path in sorted((root / name).glob("*"))
        ]
        return cls(
            encoders,
            config,
            encoder_identity([f for f in files if f.is_file()], *settings),
        )

    def encode(
        self,
        requests: Sequence[GenerationRequest],
        texts: Sequence[str],
        max_sequence_length: int,
    ) -> tuple[Tensor, Tensor]:
        """``(t5 states, pooled)`` of ``texts[i]`` (request ``requests[i]``'s), one row
        each, in order."""
        rows: list[tuple[Tensor, ...] | None] = []
        for request, text in zip(requests, texts, strict=True):
            cached = self._uses(request)
            found = (
                self.cache.get(self.cache.key(text, max_sequence_length))
                if cached
                else None
            )
            rows.append(found)
            self._note(
                request, "off" if not cached else "hit" if found is not None else "miss"
            )
        missing = [i for i, row in enumerate(rows) if row is None]
        if missing:
            txt, vec = self.encoders.encode(
                [texts[i] for i in missing], max_sequence_length
            )
            for j, i in enumerate(missing):
                rows[i] = (txt[j : j + 1], vec[j : j + 1])
                if self._uses(requests[i]):
                    key = self.cache.key(texts[i], max_sequence_length)
                    self.cache.put(key, rows[i])  # type: ignore[arg-type]
        return torch.cat([row[0] for row in rows if row is not None]), torch.cat(
            [row[1] for row in rows if row is not None]
        )

    def positive(
        self, requests: Sequence[GenerationRequest], max_sequence_length: int
    ) -> tuple[Tensor, Tensor]:
        """The requests' prompts, encoded (``encode``)."""
        return self.encode(requests, [r.prompt for r in requests], max_sequence_length)

    def negative(
        self, requests: Sequence[GenerationRequest], max_sequence_length: int
    ) -> tuple[Tensor, Tensor]:
        """The requests' negative prompts (empty where unset), encoded."""
        return self.encode(
            requests, [r.negative_prompt or "" for r in requests], max_sequence_length
        )

    def result(self, request_id: str) -> str:
        """``hit``, ``miss`` or ``off`` for the request's texts (forgotten once
        asked)."""
        return self._results.pop(request_id, "off")

    def attest(self, request_id: str) -> Attestation:
        """The request's attestation entries: ``conditioning_cache`` and
        ``conditioning_cache_state``."""
        return Attestation(
            conditioning_cache=self.result(request_id),
            conditioning_cache_state=asdict(self.state()),
        )

    def state(self) -> CacheState:
        return self.cache.state()

    def _uses(self, request: GenerationRequest) -> bool:
        return self.cache.enabled and request.conditioning_cache

    def _note(self, request: GenerationRequest, outcome: str) -> None:
        # A request with a negative prompt is encoded twice: a hit only if both texts
        # hit.
        before = self._results.get(request.request_id)
        self._results[request.request_id] = (
            outcome if before in (None, "hit") else before
        )
        # A cancelled batch's requests never ask for theirs.
        while len(self._results) > MAX_PENDING_RESULTS:
            self._results.pop(next(iter(self._results)))
