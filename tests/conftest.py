"""Shared fixtures. Tests never touch a hub: HF_HUB_OFFLINE is forced before anything imports."""

from __future__ import annotations

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --- hermetic tiny FLUX models (built once per session by diffserve.models.tiny) ---------------
@pytest.fixture(scope="session")
def tiny_flux_dir(tmp_path_factory: pytest.TempPathFactory):
    """A schnell-like (no guidance embedding) random-weight tiny-flux pipeline dir, seed 0."""
    from diffserve.models.tiny import build_flux_model

    return build_flux_model("tiny-flux", tmp_path_factory.mktemp("models") / "tiny-flux", seed=0)


@pytest.fixture(scope="session")
def tiny_flux_dev_dir(tmp_path_factory: pytest.TempPathFactory):
    """A dev-like (guidance_embeds=True) random-weight tiny-flux pipeline dir, seed 0."""
    from diffserve.models.tiny import build_flux_model

    return build_flux_model(
        "tiny-flux", tmp_path_factory.mktemp("models") / "tiny-flux-dev", seed=0, guidance_embeds=True
    )
