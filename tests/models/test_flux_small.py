"""small-flux (~150M parameters) parity with diffusers: transformer forward and one
small end-to-end run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flux_helpers import flux_transformer

from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.types.request import GenerationRequest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_dev_dir(tmp_path_factory):
    from diffserve.zoo.flux import build_flux_model

    return build_flux_model(
        "small-flux",
        tmp_path_factory.mktemp("small") / "small-flux-dev",
        seed=0,
        guidance_embeds=True,
    )


@pytest.fixture(scope="module")
def small_schnell_transformer_dir(tmp_path_factory):
    from diffusers import FluxTransformer2DModel

    from diffserve.zoo.flux_specs import get_spec

    torch.manual_seed(1)
    model = FluxTransformer2DModel(
        **get_spec("small-flux").transformer_config(guidance_embeds=False)
    )
    out = tmp_path_factory.mktemp("small-schnell") / "transformer"
    model.save_pretrained(out)
    return out


def _inputs(guidance: bool, h: int = 6, w: int = 10, txt_len: int = 24):
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return dict(
        hidden_states=torch.randn(1, h * w, 64, generator=g),
        encoder_hidden_states=torch.randn(1, txt_len, 64, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g),
        timestep=torch.tensor([0.6]),
        img_ids=ids.reshape(-1, 3),
        txt_ids=torch.zeros(txt_len, 3),
        guidance=torch.tensor([3.5]) if guidance else None,
    )


@pytest.mark.parametrize("variant", ["dev", "schnell"])
def test_small_transformer_parity(request, variant: str) -> None:
    from diffusers import FluxTransformer2DModel

    if variant == "dev":
        path = request.getfixturevalue("small_dev_dir") / "transformer"
    else:
        path = request.getfixturevalue("small_schnell_transformer_dir")
    x = _inputs(variant == "dev")
    with torch.inference_mode():
        expected = FluxTransformer2DModel.from_pretrained(str(path)).eval()(
            **x, return_dict=False
        )[0]
        ours = flux_transformer(path, attention="sdpa")
        got = ours(
            x["hidden_states"],
            x["img_ids"],
            x["encoder_hidden_states"],
            x["txt_ids"],
            x["timestep"],
            x["pooled_projections"],
            x["guidance"],
        )
    rel = ((got - expected).norm() / expected.norm()).item()
    assert rel < 1e-4, rel


def test_small_end_to_end_matches_diffusers(small_dev_dir) -> None:
    from diffusers import FluxPipeline as DiffusersFluxPipeline

    req = GenerationRequest(
        prompt="a lighthouse at dusk",
        height=128,
        width=128,
        num_inference_steps=2,
        guidance_scale=3.5,
        seed=2024,
        max_sequence_length=128,
    )
    ours = FluxPipeline.from_pretrained(
        small_dev_dir, linear_backend="torch", attention_backend="sdpa"
    )(req)
    ref = DiffusersFluxPipeline.from_pretrained(
        str(small_dev_dir), torch_dtype=torch.float32
    )
    ref.set_progress_bar_config(disable=True)
    theirs = ref(
        prompt=req.prompt,
        height=128,
        width=128,
        num_inference_steps=2,
        guidance_scale=3.5,
        max_sequence_length=128,
        generator=torch.Generator().manual_seed(2024),
        output_type="np",
    ).images
    theirs = (theirs * 255).round().astype(np.uint8)
    mse = np.mean(
        (ours.images.numpy().astype(np.float64) - theirs.astype(np.float64)) ** 2
    )
    psnr = float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
    assert psnr >= 40.0, psnr
