"""The exact conditioning cache: a text's encoder outputs, kept so a repeated prompt
skips the text encoders.

Keyed by everything that decides the encoders' output: the encoders' identity (their
weight files, tokenizer files, dtype, quantization and whether prompts are encoded one
at a time: ``encoder_identity``), the text and the token window
(``max_sequence_length``). A hit returns the very tensors the miss computed, so with
per-prompt encoding (``batch_invariant``, the default) an image made from a hit is
bit-identical to one made without the cache. Least recently used entries go first once
``max_entries`` or ``max_bytes`` would be exceeded; an entry larger than ``max_bytes``
is not kept. ``max_entries: 0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CacheKey = tuple[str, str, int]  # (encoder identity, text, max_sequence_length)


def encoder_identity(files: Iterable[Path], *settings: Any) -> str:
    """A short digest of the encoders' weight and tokenizer files (names, sizes,
    modification times: read once, never the bytes) and the settings that change their
    output (dtype, quantization, per-prompt)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        stat = path.stat()
        digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    digest.update(repr(settings).encode())
    return digest.hexdigest()[:16]


@dataclass
class CacheState:
    """What the attestation reports of the cache after a request
    (``conditioning_cache_state``)."""

    entries: int
    bytes: int
    evictions_total: int


class ConditioningCache:
    """LRU of ``key -> tensors`` bounded by entry count and bytes; thread-safe (one
    pipeline, one lock)."""

    def __init__(self, max_bytes: int, max_entries: int, identity: str) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.identity = identity
        self._entries: OrderedDict[CacheKey, tuple[torch.Tensor, ...]] = OrderedDict()
        self._bytes = 0
        self.evictions = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0

    def key(self, text: str, max_sequence_length: int) -> CacheKey:
        return (self.identity, text, max_sequence_length)

    def get(self, key: CacheKey) -> tuple[torch.Tensor, ...] | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: CacheKey, tensors: Sequence[torch.Tensor]) -> None:
        size = sum(t.numel() * t.element_size() for t in tensors)
        if not self.enabled or size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                return
            # Detached copies own their storage (a row of a batch would keep the whole
            # batch alive).
            self._entries[key] = tuple(t.detach().clone() for t in tensors)
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= sum(t.numel() * t.element_size() for t in evicted)
                self.evictions += 1

    def state(self) -> CacheState:
        with self._lock:
            return CacheState(
                entries=len(self._entries),
                bytes=self._bytes,
                evictions_total=self.evictions,
            )
