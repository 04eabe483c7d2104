"""Image edits on native FLUX: img2img (strength) and inpainting (mask) against
diffusers' FluxImg2ImgPipeline and FluxInpaintPipeline, FLUX.1 Kontext against
FluxKontextPipeline, on identical weights, inputs and seeds; the engine's admission
rules for edits; per-image seeds and batching."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from diffserve import Engine, GenerationRequest
from diffserve.errors import RequestError

PROMPT = "a red fox in the snow"
COMMON = dict(
    prompt=PROMPT,
    num_inference_steps=4,
    seed=3,
    max_sequence_length=64,
    guidance_scale=3.5,
)


def psnr(a: Any, b: Any) -> float:
    mse = float(
        (
            (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2
        ).mean()
    )
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def picture() -> np.ndarray:
    """A 64x80 input: a red half, a noisy half (so the VAE has structure to encode)."""
    image = (np.random.default_rng(0).random((64, 80, 3)) * 255).astype(np.uint8)
    image[:, :40] = (200, 30, 30)
    return image


@pytest.fixture(scope="module")
def mask() -> np.ndarray:
    out = np.zeros((64, 80), np.uint8)
    out[16:48, 20:60] = 255  # repaint the middle, keep the rest
    return out


@pytest.fixture(scope="module")
def engine(tiny_flux_dir: Path) -> Any:
    with Engine(
        str(tiny_flux_dir),
        dtype="float32",
        linear_backend="torch",
        attention_backend="sdpa",
        max_batch_size=4,
        env={},
    ) as eng:
        yield eng


def diffusers_edit(model_dir: Path, cls: str, **kwargs: Any) -> Image.Image:
    import diffusers

    pipe = getattr(diffusers, cls).from_pretrained(
        str(model_dir), torch_dtype=torch.float32
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe(
        prompt=PROMPT,
        num_inference_steps=4,
        guidance_scale=3.5,
        max_sequence_length=64,
        generator=torch.Generator().manual_seed(3),
        **kwargs,
    ).images[0]


def test_img2img_matches_diffusers_and_starts_part_way(
    engine: Any, tiny_flux_dir: Path, picture: np.ndarray
) -> None:
    out = engine.generate(GenerationRequest(**COMMON, images=(picture,), strength=0.6))
    assert out.images[0].size == (80, 64)  # the input's size (a multiple of 16 already)
    # Skips int(4 - 4 * 0.6) = 1 step, as diffusers.
    assert out.attestation["transformer_forwards"] == 3
    theirs = diffusers_edit(
        tiny_flux_dir,
        "FluxImg2ImgPipeline",
        image=Image.fromarray(picture),
        strength=0.6,
        height=64,
        width=80,
    )
    assert psnr(out.images[0], theirs) >= 40
    full = engine.generate(GenerationRequest(**COMMON, images=(picture,), strength=1.0))
    assert full.attestation["transformer_forwards"] == 4
    assert psnr(full.images[0], out.images[0]) < 40  # strength changes the picture


def test_inpainting_matches_diffusers(
    engine: Any, tiny_flux_dir: Path, picture: np.ndarray, mask: np.ndarray
) -> None:
    out = engine.generate(
        GenerationRequest(**COMMON, images=(picture,), mask=mask, strength=0.8)
    )
    theirs = diffusers_edit(
        tiny_flux_dir,
        "FluxInpaintPipeline",
        image=Image.fromarray(picture),
        mask_image=Image.fromarray(mask),
        strength=0.8,
        height=64,
        width=80,
    )
    assert psnr(out.images[0], theirs) >= 40
    plain = engine.generate(
        GenerationRequest(**COMMON, images=(picture,), strength=0.8)
    )
    assert psnr(out.images[0], plain.images[0]) < 40  # the mask made a difference


def test_kontext_matches_diffusers(
    tiny_flux_kontext_dir: Path, picture: np.ndarray
) -> None:
    with Engine(
        str(tiny_flux_kontext_dir),
        dtype="float32",
        linear_backend="torch",
        attention_backend="sdpa",
        env={},
    ) as kontext:
        assert kontext.config.model_family == "FluxKontextPipeline"
        out = kontext.generate(GenerationRequest(**COMMON, images=(picture,)))
        # A reference edit runs the whole schedule.
        assert out.attestation["transformer_forwards"] == 4
        with pytest.raises(RequestError) as info:
            kontext.generate(
                GenerationRequest(
                    **COMMON, images=(picture,), mask=np.zeros((64, 80), np.uint8)
                )
            )
        assert info.value.param == "mask"
    theirs = diffusers_edit(
        tiny_flux_kontext_dir,
        "FluxKontextPipeline",
        image=Image.fromarray(picture),
        height=64,
        width=80,
        max_area=64 * 80,
        _auto_resize=False,
    )
    assert psnr(out.images[0], theirs) >= 40


def test_edits_batch_and_keep_per_image_seeds(
    engine: Any, picture: np.ndarray, mask: np.ndarray
) -> None:
    """n=2 and concurrent edit requests (step-level batching): image i equals the
    request alone with seed i."""
    from concurrent.futures import ThreadPoolExecutor

    pair = engine.generate(
        GenerationRequest(**{**COMMON, "seed": 10}, images=(picture,), mask=mask, n=2)
    )
    assert pair.seeds == [10, 11]
    for i, seed in enumerate(pair.seeds):
        alone = engine.generate(
            GenerationRequest(**{**COMMON, "seed": seed}, images=(picture,), mask=mask)
        )
        # Native FLUX is batch invariant by construction (per-sample kernels, one VAE
        # call per image: docs/engine.md).
        assert pair.images[i].tobytes() == alone.images[0].tobytes()
    with ThreadPoolExecutor(3) as pool:
        outs = list(
            pool.map(
                lambda s: engine.generate(
                    GenerationRequest(
                        **{**COMMON, "seed": s}, images=(picture,), mask=mask
                    )
                ),
                (10, 11, 10),
            )
        )
    assert (
        outs[0].images[0].tobytes()
        == outs[2].images[0].tobytes()
        == pair.images[0].tobytes()
    )


def test_edit_requests_are_checked(
    engine: Any, tiny_sd3_dir: Path, picture: np.ndarray
) -> None:
    odd = np.zeros((50, 70, 3), np.uint8)
    out = engine.generate(GenerationRequest(**COMMON, images=(odd,), strength=0.5))
    assert out.images[0].size == (64, 48)  # rounded down to the model's multiple
    cases = [
        (dict(images=(picture, picture)), "image"),
        (dict(images=(picture,), mask=np.zeros((10, 10), np.uint8)), "mask"),
        (dict(strength=0.5), "strength"),
        (dict(images=(picture,), strength=1.5), "strength"),
        (dict(images=(picture[..., :2],)), "image"),
    ]
    for fields, param in cases:
        with pytest.raises(RequestError) as info:
            engine.generate(GenerationRequest(**COMMON, **fields))
        assert info.value.param == param, fields
    with (
        Engine(str(tiny_sd3_dir), dtype="float32", env={}) as sd3,
        pytest.raises(RequestError) as info,
    ):
        sd3.generate(GenerationRequest(**COMMON, images=(picture,)))
    assert info.value.param == "image"


def test_edit_inputs_travel_to_worker_processes(
    engine: Any, tiny_flux_dir: Path, picture: np.ndarray, mask: np.ndarray
) -> None:
    """The mp executor pickles images and mask to its worker: the same edit gives the
    same bytes."""
    request = dict(**COMMON, images=(picture,), mask=mask, strength=0.7)
    with Engine(
        str(tiny_flux_dir),
        dtype="float32",
        linear_backend="torch",
        attention_backend="sdpa",
        distributed_executor_backend="mp",
        env={},
    ) as mp:
        out = mp.generate(GenerationRequest(**request))
        assert out.attestation["executor"] == "mp"
    assert (
        out.images[0].tobytes()
        == engine.generate(GenerationRequest(**request)).images[0].tobytes()
    )
