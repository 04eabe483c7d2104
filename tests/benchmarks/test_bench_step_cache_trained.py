"""Section l's pieces that need no generation: the random twin of the toy model (its
transformer is the one training started from, everything else the trained model's), the
held-out pairs and the summary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image


def test_random_twin_is_the_toy_model_with_its_untrained_transformer(
    tmp_path: Path,
) -> None:
    import torch
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import load_file

    from benchmarks.step_cache_trained import random_twin
    from diffserve.zoo.components import MARKER_FILE, component_seed
    from diffserve.zoo.demo import toy_model_dir
    from diffserve.zoo.toy_shapes.train import TRANSFORMER_CONFIG

    trained = toy_model_dir()
    twin = random_twin(trained, tmp_path / "twin")
    weights = "transformer/diffusion_pytorch_model.safetensors"
    for name in (
        "vae/diffusion_pytorch_model.safetensors",
        "text_encoder/model.safetensors",
        "tokenizer_2/tokenizer.json",
        "scheduler/scheduler_config.json",
        "model_index.json",
    ):
        assert (twin / name).read_bytes() == (trained / name).read_bytes(), name
    assert (twin / "transformer/config.json").read_text() == (
        trained / "transformer/config.json"
    ).read_text()
    marker = json.loads((twin / MARKER_FILE).read_text())
    assert (
        marker["random_weights"] is True
        and marker["request_defaults"]["num_inference_steps"] == 8
    )

    # The trainer's start: seeded by component_seed(seed, "transformer") with the
    # training seed the shipped marker records, then FluxTransformer2DModel(config).
    seed = json.loads((trained / MARKER_FILE).read_text())["seed"]
    torch.manual_seed(component_seed(seed, "transformer"))
    start = FluxTransformer2DModel(**TRANSFORMER_CONFIG).state_dict()
    got, shipped = load_file(str(twin / weights)), load_file(str(trained / weights))
    assert got.keys() == start.keys() == shipped.keys()
    assert all(torch.equal(got[k], start[k]) for k in got)
    assert not all(torch.equal(got[k], shipped[k]) for k in got)

    before = (twin / weights).stat().st_mtime_ns
    # Built once.
    assert (
        random_twin(trained, twin) == twin
        and (twin / weights).stat().st_mtime_ns == before
    )


def test_held_out_pairs_and_summary() -> None:
    from benchmarks.step_cache_trained import (
        Point,
        held_out_pairs,
        pooled_psnr,
        summarise,
    )
    from diffserve.zoo.toy_shapes.grammar import draw, parse_prompt

    pairs = held_out_pairs(4)
    assert pairs == held_out_pairs(4) and len({seed for _, seed in pairs}) == 4
    import random

    drawn = [draw(parse_prompt(prompt), random.Random(seed)) for prompt, seed in pairs]
    noisy = [
        Image.fromarray(np.clip(np.asarray(im, np.int16) + 4, 0, 255).astype(np.uint8))
        for im in drawn
    ]
    base = Point(0.0, [2.0, 2.0, 2.2, 1.8], drawn, [{"skipped_steps": 0}] * 4)
    cached = Point(
        0.3,
        [1.0, 1.0, 1.0, 1.2],
        [drawn[0], *noisy[1:]],
        [{"skipped_steps": s} for s in (0, 2, 3, 3)],
    )
    uncached, row = summarise([base, cached], pairs)
    assert (
        uncached["speedup"] == 1.0
        and uncached["agree"] == 4
        and uncached["psnr_db"] == float("inf")
    )
    assert row["speedup"] == 2.0 and row["skipped"] == 2.0 and row["agree"] == 4
    # One identical image and three off by 4 levels: the pooled MSE is 12 (not inf, as a
    # mean of PSNRs would be).
    assert abs(row["psnr_db"] - 10 * np.log10(255**2 / 12)) < 0.05
    assert (
        row["psnr_db"] == pooled_psnr(cached.images, base.images)
        and 0.9 < row["ssim"] < 1.0
    )
