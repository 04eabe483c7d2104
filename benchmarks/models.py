"""The models every measurement shares, built once with the project's own builder and
cached.

Both contenders load the very same directory (diffusers layout), so they run identical
weights.
"""

from __future__ import annotations

import time
from pathlib import Path

DEFAULT_CACHE = Path(__file__).resolve().parent / ".cache"


def model_dir(kind: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    return Path(cache_dir) / kind


def ensure_model(kind: str, cache_dir: Path = DEFAULT_CACHE) -> tuple[Path, float]:
    """Build ``kind`` into the cache if it is not there yet; returns its directory and
    the build seconds (0 when it was cached). The builder is deterministic (seed 0), so
    a cached copy is the same model."""
    from diffserve.zoo.flux import build_flux_model

    out = model_dir(kind, cache_dir)
    if _is_current(out):
        return out, 0.0
    t0 = time.perf_counter()
    # force=True only ever replaces a previous model directory (the builder checks
    # model_index.json).
    built = build_flux_model(kind, out, seed=0, force=True)
    return Path(built), time.perf_counter() - t0


def _is_current(out: Path) -> bool:
    """A cached build counts when the builder's marker says it was written by the same
    builder version."""
    import json

    from diffserve.zoo.components import MARKER_FILE
    from diffserve.zoo.flux import BUILDER_VERSION

    try:
        marker = json.loads((out / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("builder_version") == BUILDER_VERSION
        and (out / "model_index.json").is_file()
    )


def model_facts(path: Path) -> dict[str, object]:
    """Transformer config and on-disk size of a model directory (for the report)."""
    import json

    cfg_file = Path(path) / "transformer" / "config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    keys = (
        "num_layers",
        "num_single_layers",
        "num_attention_heads",
        "attention_head_dim",
        "joint_attention_dim",
        "pooled_projection_dim",
        "in_channels",
        "guidance_embeds",
    )
    facts: dict[str, object] = {k: cfg.get(k) for k in keys}
    facts["disk_mib"] = round(size / 2**20, 1)
    return facts
