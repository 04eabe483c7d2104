"""The circles-to-stars LoRA on the trained toy model: a per-request adapter whose
effect the checker reads.

With the adapter, circle prompts come out as stars (the grammar's checker says "star",
and solidity, the object's area over its convex hull's, falls from a circle's ~0.96);
colours and every other prompt stay as the base model draws them; diffusers'
``load_lora_weights`` reads the same file and draws stars too.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from diffserve.zoo.toy_shapes.grammar import Scene, all_scenes, classify, solidity
from diffserve.zoo.toy_shapes.train import TEXT_LENGTH

PAIRS = 16


def pairs(shape_is_circle: bool, seed_base: int) -> list[tuple[Scene, int]]:
    rng = random.Random(seed_base)
    scenes = [s for s in all_scenes() if (s.shape == "circle") == shape_is_circle]
    return [(rng.choice(scenes), seed_base + i) for i in range(PAIRS)]


CIRCLES = pairs(True, 3_000_000)
OTHERS = pairs(False, 3_100_000)


@pytest.fixture(scope="module")
def images(toy_model: Path, stars_lora: Path) -> dict[str, list[Any]]:
    """Every pair with and without the adapter, through one Engine (requests batch per
    adapter set)."""
    from diffserve import Engine, GenerationRequest

    out: dict[str, list[Any]] = {}
    # A quality check, not an invariance one: whole-batch kernels (per-sample calls cost
    # ~40% more at 64x64).
    with Engine(
        str(toy_model),
        dtype="float32",
        max_batch_size=8,
        lora_modules=f"stars={stars_lora}",
        batch_invariant=False,
        env={},
    ) as engine:

        def one(job: tuple[tuple[Scene, int], tuple]) -> Any:
            (scene, seed), loras = job
            result = engine.generate(
                GenerationRequest(
                    prompt=scene.prompt, height=64, width=64, seed=seed, loras=loras
                )
            )
            if loras:
                assert result.attestation["lora"] == {
                    "adapters": [{"name": "stars", "scale": 1.0}]
                }
                assert result.attestation["lora_linear_calls"] > 0
            return result.images[0]

        with ThreadPoolExecutor(8) as pool:
            for label, loras in (("base", ()), ("stars", (("stars", 1.0),))):
                out[label] = list(pool.map(one, [(p, loras) for p in CIRCLES + OTHERS]))
    return out


def test_the_adapter_turns_circles_into_stars(images: dict[str, list[Any]]) -> None:
    """Measured: the checker reads 16/16 base circles as circles and, with the adapter,
    12/16 as stars (4 circles, solidity 0.899-0.914; the stars' at most 0.846, the
    checker's line 0.88); median solidity 0.954 without, 0.806 with."""
    base = [classify(im).shape for im in images["base"][:PAIRS]]
    stars = [classify(im).shape for im in images["stars"][:PAIRS]]
    assert base.count("circle") >= PAIRS - 2, base
    assert stars.count("star") >= PAIRS // 2 + 1 and stars.count("circle") <= 4, stars
    base_solidity = np.median([solidity(im) for im in images["base"][:PAIRS]])
    assert (
        np.median([solidity(im) for im in images["stars"][:PAIRS]])
        < base_solidity - 0.08
    )


def test_the_adapter_keeps_colours_and_other_shapes(
    images: dict[str, list[Any]],
) -> None:
    """Measured: both colours right in 32/32 images with the adapter; non-circle prompts
    are read as their shape in 14/16 images (12/16 without it), at a median PSNR of 32.4
    dB against the base model's image (circle prompts: 16.0 dB, they change shape)."""
    read = [classify(image) for image in images["stars"]]
    colours = [
        (got.colour, got.background) == (scene.colour, scene.background)
        for (scene, _), got in zip(CIRCLES + OTHERS, read, strict=True)
    ]
    assert sum(colours) >= 0.8 * len(colours), [
        (s, g) for (s, _), g in zip(CIRCLES + OTHERS, read, strict=True)
    ]

    def drawn_as_prompted(label: str) -> int:
        return sum(
            classify(im).shape == scene.shape
            for (scene, _), im in zip(OTHERS, images[label][PAIRS:], strict=True)
        )

    assert drawn_as_prompted("stars") >= drawn_as_prompted("base") - 2
    others = [
        _psnr(a, b)
        for a, b in zip(images["base"][PAIRS:], images["stars"][PAIRS:], strict=True)
    ]
    circles = [
        _psnr(a, b)
        for a, b in zip(images["base"][:PAIRS], images["stars"][:PAIRS], strict=True)
    ]
    assert np.median(others) >= 24.0 and np.median(others) > np.median(circles) + 3.0, (
        others,
        circles,
    )


def test_diffusers_reads_the_adapter_and_draws_stars(
    toy_model: Path, stars_lora: Path
) -> None:
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(toy_model), torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(
        str(stars_lora.parent), weight_name=stars_lora.name, adapter_name="stars"
    )
    chosen = CIRCLES[:6]
    drawn = pipe(
        [s.prompt for s, _ in chosen],
        height=64,
        width=64,
        num_inference_steps=8,
        guidance_scale=0.0,
        max_sequence_length=TEXT_LENGTH,
        generator=[torch.Generator().manual_seed(seed) for _, seed in chosen],
    ).images
    read = [classify(im).shape for im in drawn]
    assert read.count("star") >= 3, read


def test_make_model_copies_the_shipped_adapter(
    tmp_path: Path, stars_lora: Path
) -> None:
    from diffserve.entrypoints.cli import main

    assert main(["make-model", "toy-shapes-stars", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / stars_lora.name).read_bytes() == stars_lora.read_bytes()
    # Not empty, no --force: a ConfigError.
    assert main(["make-model", "toy-shapes-stars", str(tmp_path / "a")]) == 1
    assert main(["make-model", "toy-shapes-stars", str(tmp_path / "a"), "--force"]) == 0


def test_adapter_training_runs_end_to_end_on_a_tiny_budget(
    tmp_path: Path, toy_model: Path, stars_lora: Path
) -> None:
    """Every stage of the trainer on two steps (the shipped adapter took 48 s): a file
    with the shipped keys."""
    from safetensors import safe_open

    from diffserve.zoo.toy_shapes.lora import LoraTrainConfig, train_stars_lora

    out = train_stars_lora(
        tmp_path / "stars",
        toy_model,
        LoraTrainConfig(images=16, steps=2, batch=4, threads=1),
    )
    for name in ("training.json", "loss.png"):
        assert (out.parent / name).is_file(), name
    with (
        safe_open(str(out), framework="pt") as trained,
        safe_open(str(stars_lora), framework="pt") as shipped,
    ):
        assert sorted(trained.keys()) == sorted(shipped.keys())  # noqa: SIM118 - safe_open is not a mapping


def _psnr(a: Any, b: Any) -> float:
    mse = float(
        (
            (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)) ** 2
        ).mean()
    )
    return 99.0 if mse == 0 else float(10 * np.log10(255.0**2 / mse))


@pytest.fixture(scope="module")
def toy_model() -> Path:
    from diffserve.zoo.demo import toy_model_dir

    return toy_model_dir()


@pytest.fixture(scope="module")
def stars_lora() -> Path:
    from diffserve.zoo.toy_shapes.lora import shipped_stars_lora

    return shipped_stars_lora()
