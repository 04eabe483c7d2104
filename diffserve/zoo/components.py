"""Write a model's components: each from its own seed, saved as safetensors, with JSON
beside them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffserve.registry.models import MODEL_MARKER_FILE as MARKER_FILE

__all__ = ["MARKER_FILE", "component_seed", "save_components", "write_json"]


def component_seed(seed: int, component: str) -> int:
    """Independent per-component seed, so changing one component never shifts another's
    weights."""
    digest = hashlib.sha256(f"diffserve:{seed}:{component}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def save_components(
    factories: dict[str, Callable[[], Any]], out: Path, seed: int
) -> None:
    """Build each component from its own seed (``component_seed``) and save it as
    safetensors under ``out``."""
    import torch
    from transformers.utils import logging as hf_logging

    # A "Writing model shards" bar per tiny file is noise; restore the caller's setting
    # afterwards.
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # fork_rng: the caller's global RNG state is untouched however many modules we
    # initialise.
    try:
        with torch.random.fork_rng(devices=[]):
            for name, factory in factories.items():
                torch.manual_seed(component_seed(seed, name))
                with torch.no_grad():
                    module = factory().eval()
                module.save_pretrained(str(out / name), safe_serialization=True)
                del module
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as sorted, indented JSON (byte-identical for equal data)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def shipped_model_dir(asset: str) -> Path:
    """A trained pipeline shipped in the package (``diffserve/assets/<asset>``, named as
    ``make-model`` names it); a ``ConfigError`` saying how to get it back when its files
    are missing."""
    from diffserve.errors import ConfigError

    path = Path(__file__).resolve().parent.parent / "assets" / asset
    if not (path / "model_index.json").is_file() or not (path / MARKER_FILE).is_file():
        raise ConfigError(
            f"the shipped {asset} model is missing from {path}",
            path="model",
            hint="reinstall diffserve, or train it: diffserve make-model "
            f"{asset} DIR --train",
        )
    return path
