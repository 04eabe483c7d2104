"""Fixtures for config tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def flux_model(tmp_path: Path) -> Path:
    model = tmp_path / "flux"
    model.mkdir()
    (model / "model_index.json").write_text(
        json.dumps({"_class_name": "FluxPipeline"}), encoding="utf-8"
    )
    return model
