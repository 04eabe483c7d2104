"""The body of ``GET /v1/config``: the resolved config's values with where each one came from."""

from __future__ import annotations

from typing import Any


def config_view(cfg: Any) -> dict[str, Any]:
    """The same document as ``diffserve config explain --json`` (one renderer, owned by config)."""
    from diffserve.config.explain import explain_dict

    return explain_dict(cfg)
