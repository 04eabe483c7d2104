"""Score a toy-motion model with its checker: held-out prompt/seed pairs through
diffserve's ``Engine``.

Held out means new seeds (the starting noise) for prompts of the grammar, far from
anything training drew; a seed set is one such sample (the issue's bars are met on
three). The videos are generated at the model's own request defaults (steps, frames,
size) unless told otherwise, as a user would get them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from diffserve.zoo.toy_motion.checker import score
from diffserve.zoo.toy_motion.grammar import MotionScene, all_scenes

SEED_BASE = 5_000_000  # generation seeds far from the training's
BATCH = 8


def held_out_pairs(count: int, seed_set: int = 0) -> list[tuple[MotionScene, int]]:
    """``count`` (scene, seed) pairs of seed set ``seed_set``: the same pairs on every
    call."""
    rng = random.Random(7919 * (seed_set + 1))
    scenes = all_scenes()
    base = SEED_BASE + 100_000 * seed_set
    return [(rng.choice(scenes), base + i) for i in range(count)]


def generate_videos(
    model: Path | str,
    pairs: list[tuple[MotionScene, int]],
    settings: Mapping[str, Mapping[str, Any]],
) -> dict[str, list[list[Any]]]:
    """Per named setting (more GenerationRequest fields, e.g. ``{"guidance_scale":
    3.0}``), each pair's video as a list of uint8 [H, W, 3] frames; one engine for all
    of them, ``BATCH`` requests at a time (they batch)."""
    import numpy as np

    from diffserve import Engine, GenerationRequest

    # A quality check, not an invariance one: whole-batch kernels.
    with Engine(
        str(model), dtype="float32", max_batch_size=BATCH, batch_invariant=False, env={}
    ) as engine:

        def one(job: tuple[tuple[MotionScene, int], Mapping[str, Any]]) -> list[Any]:
            (scene, seed), request = job
            out = engine.generate(
                GenerationRequest(prompt=scene.prompt, seed=seed, **request)
            )
            return list(np.asarray(out.videos[0]))

        with ThreadPoolExecutor(BATCH) as pool:
            return {
                name: list(pool.map(one, [(pair, request) for pair in pairs]))
                for name, request in settings.items()
            }


def evaluate(
    model: Path | str,
    pairs: list[tuple[MotionScene, int]],
    settings: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, float]]:
    """Per named setting, the checker's four rates (background, colour, direction,
    shape) over ``pairs``' videos."""
    videos = generate_videos(model, pairs, settings)
    return {
        name: score(
            (scene, video) for (scene, _), video in zip(pairs, clips, strict=True)
        ).rates()
        for name, clips in videos.items()
    }
