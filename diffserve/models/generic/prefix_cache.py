"""Qwen-Image-2.1's prefix KV cache, counted: the first forward of each CFG branch fills
every block's text keys and values (``extract``), every later one reads them instead of
running the text through the blocks again (``cached``). diffusers' pipeline makes a
fresh cache per call, so the counts are the batch's, and each request of it reports
them (``prefix_kv_cache``: ``prefills``, ``hits``): steps - 1 hits per branch when the
cache works, none when a forward ran the whole sequence."""

from __future__ import annotations

from typing import Any

from torch import nn


class PrefixKvCounter:
    """Counts the denoiser's forwards by the value of its ``argument`` keyword."""

    def __init__(self, denoiser: nn.Module, argument: str) -> None:
        self.argument = argument
        self.modes: dict[str, int] = {}
        denoiser.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        mode = str(kwargs.get(self.argument) or "off")
        self.modes[mode] = self.modes.get(mode, 0) + 1

    def start(self) -> None:
        self.modes = {}

    def attest(self) -> dict[str, int]:
        """This batch's forwards: ``prefills`` (filled the cache), ``hits`` (read it)
        and ``uncached`` (ran the whole sequence without one)."""
        return {
            "prefills": self.modes.get("extract", 0),
            "hits": self.modes.get("cached", 0),
            "uncached": sum(
                n for mode, n in self.modes.items() if mode not in ("extract", "cached")
            ),
        }
