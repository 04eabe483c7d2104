"""Section q's pieces that need no generation: the random twin of the toy video model
(its transformer is the one training started from, every other file the trained
model's), the held-out pairs, the summary on synthetic clips and the report rows. The
twin's test reads the trained toy-motion model (``toy_motion_dir``); its checks take the
directory as a parameter (``check_random_twin``)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


def check_random_twin(trained: Path, tmp_path: Path) -> None:
    """The twin of ``trained``: every file but the transformer's weights, the marker and
    the training log byte for byte the trained model's; the transformer the trainer's
    start; built once."""
    import torch
    from diffusers import WanTransformer3DModel
    from safetensors.torch import load_file

    from benchmarks.cache_sweep import TRAINING_FILES
    from benchmarks.step_cache_video import random_twin
    from diffserve.zoo.components import MARKER_FILE, component_seed

    twin = random_twin(trained, tmp_path / "twin")
    kept = {
        p.relative_to(trained).as_posix() for p in trained.rglob("*") if p.is_file()
    } - {WEIGHTS, MARKER_FILE, *TRAINING_FILES}
    assert {
        p.relative_to(twin).as_posix() for p in twin.rglob("*") if p.is_file()
    } == kept | {WEIGHTS, MARKER_FILE}
    assert {
        "vae/diffusion_pytorch_model.safetensors",
        "text_encoder/model.safetensors",
        "tokenizer/tokenizer.json",
        "transformer/config.json",
        "model_index.json",
    } <= kept
    for name in kept:  # the transformer's config.json included
        assert (twin / name).read_bytes() == (trained / name).read_bytes(), name
    marker = json.loads((twin / MARKER_FILE).read_text())
    assert marker["random_weights"] is True and marker["kind"] == "toy-motion-random"
    assert (
        marker["request_defaults"]
        == json.loads((trained / MARKER_FILE).read_text())["request_defaults"]
    )

    # The trainer's start (_train_into): seeded by component_seed(seed, "transformer"),
    # then WanTransformer3DModel(**config) (its TRANSFORMER_CONFIG, as the trained
    # config.json records it); the EMA is a deepcopy made after it and draws nothing.
    config = {
        k: v
        for k, v in json.loads(
            (trained / "transformer/config.json").read_text()
        ).items()
        if not k.startswith("_")
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(component_seed(0, "transformer"))
        start = WanTransformer3DModel(**config).state_dict()
    got, shipped = load_file(str(twin / WEIGHTS)), load_file(str(trained / WEIGHTS))
    assert got.keys() == start.keys() == shipped.keys()
    # Every tensor the start's.
    assert {k for k in got if torch.equal(got[k], start[k])} == set(start)
    # And not the trained ones.
    assert any(not torch.equal(got[k], shipped[k]) for k in got)

    before = (twin / WEIGHTS).stat().st_mtime_ns
    # Built once.
    assert (
        random_twin(trained, twin) == twin
        and (twin / WEIGHTS).stat().st_mtime_ns == before
    )


def test_random_twin_is_the_toy_video_model_with_its_untrained_transformer(
    tmp_path: Path,
) -> None:
    from diffserve.zoo.wan import toy_motion_dir

    check_random_twin(toy_motion_dir(), tmp_path)


def test_held_out_pairs_are_fixed_and_not_the_models_own_evaluation() -> None:
    from benchmarks.step_cache_video import held_out_pairs
    from diffserve.zoo.toy_motion import evaluate
    from diffserve.zoo.toy_motion.grammar import parse_prompt

    pairs = held_out_pairs(8)
    assert pairs == held_out_pairs(8) and pairs[:3] == held_out_pairs(3)
    assert (
        len({seed for _, seed in pairs}) == 8
        and len({prompt for prompt, _ in pairs}) > 1
    )
    assert all(parse_prompt(prompt).prompt == prompt for prompt, _ in pairs)
    theirs = {seed for s in range(10) for _, seed in evaluate.held_out_pairs(64, s)}
    assert not theirs & {seed for _, seed in pairs}
    from benchmarks.step_cache_trained import held_out_pairs as image_pairs

    assert not {seed for _, seed in image_pairs(64)} & {seed for _, seed in pairs}


def _clips(pairs: list[tuple[str, int]]) -> list[np.ndarray]:
    from diffserve.zoo.toy_motion.grammar import draw_clip, parse_prompt

    return [
        np.stack(
            [
                np.asarray(f, np.uint8)
                for f in draw_clip(parse_prompt(p), random.Random(s))
            ]
        )
        for p, s in pairs
    ]


def _points() -> tuple[list[tuple[str, int]], list[Any]]:
    from benchmarks.step_cache_video import Point, held_out_pairs

    pairs = held_out_pairs(4)
    drawn = _clips(pairs)
    brighter = [
        np.clip(clip.astype(np.int16) + 4, 0, 255).astype(np.uint8) for clip in drawn
    ]
    # Pair 0 identical, 1 and 2 four levels brighter, 3 played backwards: the same
    # frames, the opposite motion.
    cached = [drawn[0], brighter[1], brighter[2], drawn[3][::-1]]
    base = Point(0.0, [2.0, 2.0, 2.2, 1.8], drawn, [{"skipped_steps": 0}] * 4)
    return pairs, [
        base,
        Point(
            0.3,
            [1.0, 1.0, 1.0, 1.2],
            cached,
            [{"skipped_steps": s} for s in (0, 2, 3, 3)],
        ),
    ]


def test_summary_pools_every_frame_and_reads_the_clips() -> None:
    from benchmarks.cache_sweep import pooled_psnr
    from benchmarks.step_cache_video import summarise

    pairs, (base, cached) = _points()
    uncached, row = summarise([base, cached], pairs)
    assert (
        uncached["speedup"] == 1.0
        and uncached["psnr_db"] == float("inf")
        and uncached["ssim"] == 1.0
    )
    assert (
        uncached["agree"] == 4 and uncached["direction"] == 4 and uncached["pairs"] == 4
    )
    assert row["speedup"] == 2.0 and row["skipped"] == 2.0
    # The reversed clip keeps its colours and shape but not its direction.
    assert row["agree"] == 3 and row["direction"] == 3
    frames = [f for clip in cached.images for f in clip]
    reference = [f for clip in base.images for f in clip]
    assert len(frames) == 4 * 17 and row["psnr_db"] == pooled_psnr(frames, reference)
    # One MSE over all 68 frames (not a mean of per-clip PSNRs, infinite for the
    # identical clip).
    mse = np.mean((np.stack(frames).astype(np.float64) - np.stack(reference)) ** 2)
    assert abs(row["psnr_db"] - 10 * np.log10(255**2 / mse)) < 1e-3
    assert 0.5 < row["ssim"] < 1.0


def test_report_rows_match_the_columns() -> None:
    from benchmarks.section import Section
    from benchmarks.step_cache_video import sweep

    pairs, points = _points()
    section = Section("cache_video", "q")
    plan = sweep(pairs)
    section.columns = plan.columns()
    from benchmarks.cache_sweep import report

    report(section, plan, "trained", "teacache", points, [[0.1, 0.2], [0.3]])
    assert [len(r) for r in section.rows] == [len(section.columns)] * 2
    assert section.rows[1][2] == "0.3" and section.rows[1][-2:] == ["3/4", "3/4"]
    assert section.metrics["cache_video.trained.teacache.t0.3.direction"] == 3
    assert section.metrics["cache_video.trained.teacache.signal_median"] == 0.2
    assert (
        section.columns[-2:] == ["checker agrees", "direction right"]
        and "median s/video" in section.columns
    )
