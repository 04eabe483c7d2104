"""A bounded in-memory store of encoded images behind ``response_format=url``.

URLs are unguessable (128 random bits) and expire after ``ttl_s``; the oldest entries
are evicted first when the byte budget is exceeded, so a burst of url requests cannot
exhaust server memory.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredImage:
    data: bytes
    media_type: str
    expires_at: float


class ImageStore:
    def __init__(self, ttl_s: float = 600.0, max_bytes: int = 256 << 20) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, StoredImage] = OrderedDict()
        self._bytes = 0
        # Handlers run on the event loop but encoding threads may also put(); keep it
        # simple and safe.
        self._lock = threading.Lock()

    def put(self, data: bytes, media_type: str, ext: str) -> str:
        """Store bytes and return the file name (``<id>.<ext>``) to serve them under."""
        name = f"{secrets.token_hex(16)}.{ext}"
        with self._lock:
            self._expire(time.monotonic())
            self._items[name] = StoredImage(
                data, media_type, time.monotonic() + self.ttl_s
            )
            self._bytes += len(data)
            while self._bytes > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old.data)
        return name

    def get(self, name: str) -> StoredImage | None:
        with self._lock:
            self._expire(time.monotonic())
            return self._items.get(name)

    def __len__(self) -> int:
        return len(self._items)

    def _expire(self, now: float) -> None:
        # Entries are inserted in expiry order (constant TTL), so expired ones sit at
        # the front.
        while self._items:
            name, item = next(iter(self._items.items()))
            if item.expires_at > now:
                break
            del self._items[name]
            self._bytes -= len(item.data)
