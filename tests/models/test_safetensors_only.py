"""Model directories load from safetensors only: a pickle checkpoint is refused, never
unpickled.

Each case copies the tiny model and swaps one component's safetensors for the pickle
file the libraries would otherwise fall back to (transformers: pytorch_model.bin,
diffusers: diffusion_pytorch_model.bin).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffserve.errors import ModelLoadError
from diffserve.models.flux.pipeline import FluxPipeline

# component -> (the safetensors file the builder writes, the pickle name its loader
# would fall back to)
COMPONENTS = {
    "text_encoder": ("model.safetensors", "pytorch_model.bin"),
    "text_encoder_2": ("model.safetensors", "pytorch_model.bin"),
    "vae": ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin"),
    "transformer": (
        "diffusion_pytorch_model.safetensors",
        "diffusion_pytorch_model.bin",
    ),
}


class _Payload:
    """Unpickling this creates ``marker``: proof that a pickle ran, whatever the loader
    does next."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _swap_for_pickle(
    tiny_flux_dir: Path, tmp_path: Path, component: str, extra: dict | None = None
) -> Path:
    model = tmp_path / "model"
    shutil.copytree(tiny_flux_dir, model)
    safetensors_name, pickle_name = COMPONENTS[component]
    weights = model / component / safetensors_name
    state_dict = load_file(str(weights))
    weights.unlink()
    torch.save({**state_dict, **(extra or {})}, model / component / pickle_name)
    return model


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_pickle_weights_are_refused(
    tiny_flux_dir: Path, tmp_path: Path, component: str
) -> None:
    # The same tensors, only as a pickle: every loader would accept them without
    # use_safetensors.
    model = _swap_for_pickle(tiny_flux_dir, tmp_path, component)
    with pytest.raises(ModelLoadError, match="safetensors") as info:
        FluxPipeline.from_pretrained(model)
    assert component in str(info.value)


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_a_hostile_pickle_is_never_unpickled(
    tiny_flux_dir: Path, tmp_path: Path, component: str
) -> None:
    marker = tmp_path / "pickle-ran"
    model = _swap_for_pickle(
        tiny_flux_dir, tmp_path, component, {"payload": _Payload(marker)}
    )
    with pytest.raises(ModelLoadError):
        FluxPipeline.from_pretrained(model)
    assert not marker.exists()


def test_the_payload_runs_when_unpickled(tmp_path: Path) -> None:
    # Guards the test above: the payload really fires, so its marker's absence means
    # "never unpickled".
    marker = tmp_path / "pickle-ran"
    torch.save({"payload": _Payload(marker)}, tmp_path / "x.bin")
    torch.load(tmp_path / "x.bin", weights_only=False)
    assert marker.exists()


def test_the_tiny_model_itself_still_loads(tiny_flux_dir: Path) -> None:
    assert (
        FluxPipeline.from_pretrained(tiny_flux_dir).capabilities.family
        == "FluxPipeline"
    )
