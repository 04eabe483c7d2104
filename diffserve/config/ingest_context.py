"""``Ctx``: where a config document being walked sits in the precedence order, and how
to cite its values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diffserve.config.provenance import Collector, Source
from diffserve.config.yaml_lines import key_line


@dataclass(frozen=True)
class Ctx:
    """Where the document being walked sits in the precedence order, and how to cite
    it."""

    out: Collector
    rank: int
    layer: str
    file: str | None = None
    detail: str | None = None
    # Caller overrides also accept flat names (tensor_parallel_size=2)
    allow_flat: bool = False

    def src(self, mapping: Any, key: Any) -> Source:
        if self.file is not None:
            line = key_line(mapping, key) or getattr(mapping, "line", None)
            return Source(self.layer, self.file, line, self.detail)
        # Env and caller values have no file: name the variable, or the key the caller
        # used.
        return Source(self.layer, detail=self.detail or str(key))
