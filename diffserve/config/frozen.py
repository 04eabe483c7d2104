"""``FrozenDict``: the read-only mapping of resolved config values (attention roles,
LoRA modules, extras)."""

from __future__ import annotations

from typing import Any


class FrozenDict(dict):
    """A read-only dict that pickles (``MappingProxyType`` does not) and hashes."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("config mappings are read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore
    __ior__ = _readonly  # type: ignore

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        # Default dict-subclass pickling replays __setitem__, which is blocked above.
        return (FrozenDict, (dict(self),))
