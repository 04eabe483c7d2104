"""Image edits on the trained toy-shapes model (issue 20, item 5), read back by the
grammar's checker.

tests/models/test_edits.py proves that img2img and inpainting match diffusers on random
weights, where the images are noise; here the shipped toy-shapes model draws, so what an
edit did can be read: which colour and shape the object has, which background, which
pixels stayed. Every request goes through ``diffserve.Engine`` (float32, 64x64, the
model's 8 steps, guidance 0, up to 8 requests a batch).

What the measurements taught (and why the checks are shaped as they are):

- The model follows its prompt's object colour from 2 of 8 steps on: img2img at strength
  0.2 (the schedule
  starts at sigma 0.345) kept the input's object colour in only 3-5 of 16 images
  (version 1). "Low" strength is therefore 0.1: the last step only, from sigma 0.184.
- The toy VAE's decoder is not local (8x8 latents and a mid-block attention): a kept
  ring one latent (8 px)
  wide decodes to the colour of what it surrounds, and a kept 32x32 centre inside a
  repainted new background drifted by 43-54 in mean absolute pixel difference (a kept
  half: 11-13). Kept regions are therefore large (an 8-px border whose content agrees
  with the prompt, or a 32-px half) and aligned to the 16-px token grid where the
  repainted content disagrees with them.
- Inpainting harmonises: next to a kept half, the repainted half mostly continues the
  kept background
  (a prompt's other background showed there in 5-7 of 16) and draws the object in the
  input's colour about as often as in the prompt's. The mask's effect is read where it
  is sharp, in the kept region, against the same requests without a mask.

Thresholds come from measurement (four other sets of 16 inputs, then this file's own
set) with margin; the figures are in each test's docstring, for the shipped weights
(toy-shapes version 2, trained on a 32-token text window; measured on a 2-core Intel
AMX). Version 1 (FLUX.1's 512-token window, where one pad token carrying log(504) took
most of the text's attention) kept more of an input: img2img at 0.1 kept the object
colour in 10-14 of 16 (version 2: 7-10) and the half-mask test the left half's colour in
14-16 (version 2: 9-14), and it drew fewer prompt shapes at strength 1.0 (8-14; version
2: 12-15). Float32 results are deterministic on one machine and move only in the last
digits across CPUs.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from diffserve.zoo.toy_shapes.grammar import (
    COLOURS,
    SHAPES,
    Scene,
    classify,
    draw,
    palette_labels,
)

N = 16  # inputs per check
SEED_BASE = 3_000_000  # generation seeds far from anything training used
# Img2img strengths: the last of 8 steps only; the whole schedule from pure noise.
LOW, HIGH = (0.1, 1.0)
NAMES = list(COLOURS)


@dataclass(frozen=True)
class Edit:
    """One edit: the input's scene and its drawing, the prompt's scene, the generation
    seed; after ``run``, the engine's output (uint8 64x64x3)."""

    scene: Scene
    image: np.ndarray
    prompt: Scene
    seed: int
    output: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 3), np.uint8))


def inputs(salt: int) -> list[tuple[Scene, np.ndarray]]:
    """``N`` random scenes of the grammar, drawn procedurally (position and size
    jittered)."""
    rng = random.Random(salt)
    out = []
    for i in range(N):
        background = rng.choice(NAMES)
        scene = Scene(
            rng.choice([c for c in NAMES if c != background]),
            rng.choice(SHAPES),
            background,
        )
        out.append((scene, np.asarray(draw(scene, random.Random(salt * 1000 + i)))))
    return out


def another(rng: random.Random, *taken: str) -> str:
    return rng.choice([c for c in NAMES if c not in taken])


def edits(salt: int, prompt_of: Any) -> list[Edit]:
    """One edit per input of ``inputs(salt)``; ``prompt_of(scene, rng)`` gives the
    prompt's scene."""
    rng = random.Random(f"prompts {salt}")  # a stream apart from the inputs'
    return [
        Edit(scene, image, prompt_of(scene, rng), SEED_BASE + salt * 100 + i)
        for i, (scene, image) in enumerate(inputs(salt))
    ]


def run(
    engine: Any, batch: list[Edit], *, strength: float, mask: np.ndarray | None = None
) -> list[Edit]:
    """``batch`` through the engine, 8 threads so that the requests batch; each edit
    with its output."""
    from diffserve import GenerationRequest

    def one(edit: Edit) -> Edit:
        request = GenerationRequest(
            prompt=edit.prompt.prompt,
            images=(edit.image,),
            mask=mask,
            strength=strength,
            seed=edit.seed,
            height=64,
            width=64,
        )
        return replace(
            edit, output=np.asarray(engine.generate(request).images[0].convert("RGB"))
        )

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, batch))


def read(batch: list[Edit]) -> list[Scene]:
    """The grammar's checker on every output."""
    from PIL import Image

    return [classify(Image.fromarray(e.output)) for e in batch]


def count(got: list[Scene], want: list[Scene], attr: str) -> int:
    return sum(
        getattr(g, attr) == getattr(w, attr) for g, w in zip(got, want, strict=True)
    )


def mad(batch: list[Edit], region: np.ndarray) -> float:
    """Mean absolute pixel difference (0-255) between outputs and inputs over
    ``region``, over the batch."""
    return float(
        np.mean(
            [
                np.abs(e.output.astype(np.float32) - e.image)[region].mean()
                for e in batch
            ]
        )
    )


def object_colour(image: np.ndarray, background: str) -> str:
    """The checker's object rule on a part of an image: the dominant palette colour
    other than ``background``."""
    labels = palette_labels(image)
    counts = np.bincount(labels.ravel(), minlength=len(NAMES))
    counts[NAMES.index(background)] = -1
    return NAMES[int(counts.argmax())]


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from diffserve import Engine
    from diffserve.zoo.demo import toy_model_dir

    # A quality check, not an invariance one: whole-batch kernels (per-sample calls cost
    # ~40% more at 64x64).
    with Engine(
        str(toy_model_dir()),
        dtype="float32",
        max_batch_size=8,
        batch_invariant=False,
        env={},
    ) as eng:
        yield eng


def test_img2img_keeps_the_input_at_low_strength_and_draws_the_prompt_at_full(
    engine: Any,
) -> None:
    """Prompts name another object colour and another shape on the input's background.

    Strength 0.1 (the last step, from sigma 0.184): the checker reads the input's colour
    and shape, and the pixels stay near the input; strength 1.0 (pure noise, the input
    unused): the prompt's colour and shape. Measured (of 16; four other sets, then this
    file's set): at 0.1 input colour 10/7/8/10, 9; input shape 10/10/14/9, 10; prompt
    colour 1/1/3/0, 1; mean abs difference 15.2/16.1/13.7/16.3, 16.9. At 1.0 prompt
    colour 15/15/16/16, 15; prompt shape 14/12/15/12, 14; input colour 0 everywhere;
    input shape 0/0/0/1, 1; difference 36.7/35.9/32.7/34.0, 33.5. Background: 16
    everywhere. The object colour is the input's in ~55% at 0.1 (the last step still
    moves some objects to the prompt's colour), so its floor is 8 of 16 (this set: 9).
    """

    def prompt_of(scene: Scene, rng: random.Random) -> Scene:
        shape = rng.choice([s for s in SHAPES if s != scene.shape])
        return Scene(
            another(rng, scene.colour, scene.background), shape, scene.background
        )

    batch = edits(1, prompt_of)
    everywhere = np.ones((64, 64), bool)
    inputs_, prompts = [e.scene for e in batch], [e.prompt for e in batch]
    low = run(engine, batch, strength=LOW)
    got = read(low)
    scores = {
        "input colour": count(got, inputs_, "colour"),
        "input shape": count(got, inputs_, "shape"),
        "prompt colour": count(got, prompts, "colour"),
        "background": count(got, inputs_, "background"),
        "difference": round(mad(low, everywhere), 1),
    }
    assert (
        scores["input colour"] >= 8
        and scores["input shape"] >= 9
        and scores["prompt colour"] <= 4
    ), scores
    assert scores["background"] >= 15 and scores["difference"] <= 20, scores

    high = run(engine, batch, strength=HIGH)
    got = read(high)
    scores = {
        "prompt colour": count(got, prompts, "colour"),
        "prompt shape": count(got, prompts, "shape"),
        "input colour": count(got, inputs_, "colour"),
        "input shape": count(got, inputs_, "shape"),
        "background": count(got, inputs_, "background"),
        "difference": round(mad(high, everywhere), 1),
    }
    assert scores["prompt colour"] >= 13 and scores["input colour"] <= 1, scores
    assert scores["prompt shape"] >= 6 and scores["input shape"] <= 5, scores
    assert scores["background"] >= 15 and scores["difference"] >= 25, scores


def test_inpainting_repaints_the_box_and_keeps_the_border(engine: Any) -> None:
    """Mask = the central box [8, 56) (the object, all but the tips of the largest),
    prompt = another object colour on the input's background, strength 1.0.

    The checker reads the prompt's object colour on the input's background; the kept
    8-px border stays close to the input (the toy VAE's round trip alone differs by ~8)
    while the box changes a lot. The border's content agrees with the prompt here; the
    next test is the one where the kept region contradicts it. Measured (of 16; four
    other sets, then this file's set): prompt colour 16/15/16/15, 16; background 16
    everywhere; input colour 0 everywhere; border difference 7.3/7.2/7.5/7.8, 7.2; box
    difference 45.6/44.6/42.6/51.6, 42.1.
    """
    mask = np.zeros((64, 64), np.uint8)
    mask[8:56, 8:56] = 255
    batch = edits(
        2,
        lambda s, rng: Scene(
            another(rng, s.colour, s.background), s.shape, s.background
        ),
    )
    done = run(engine, batch, strength=1.0, mask=mask)
    got = read(done)
    kept = mask == 0
    scores = {
        "prompt colour": count(got, [e.prompt for e in done], "colour"),
        "input colour": count(got, [e.scene for e in done], "colour"),
        "background": count(got, [e.scene for e in done], "background"),
        "border difference": round(mad(done, kept), 1),
        "box difference": round(mad(done, ~kept), 1),
    }
    assert (
        scores["prompt colour"] >= 13
        and scores["input colour"] <= 2
        and scores["background"] >= 15
    ), scores
    assert scores["border difference"] <= 12 and scores["box difference"] >= 30, scores


def test_inpainting_keeps_the_unmasked_half_against_the_prompt(engine: Any) -> None:
    """Mask = the right half (two token columns), prompt = another object colour on the
    input's background, strength 1.0; the same requests without the mask are the
    control.

    With the mask, the kept left half still shows the input's object colour and its
    pixels stay near the input; without it, the left half shows the prompt's colour.
    (The repainted half is a mix: next to the kept half the model continues the input's
    object about as often as it draws the prompt's.) Measured (of 16; four other sets,
    then this file's set): masked, left half in the input's colour 12/9/12/14, 11, in
    the prompt's 0/1/1/0, 2, left-half difference 14.4/14.9/14.6/15.0, 13.5; unmasked,
    input's colour 0 everywhere, prompt's 16/15/15/16, 15, difference
    29.5/34.4/33.9/34.5, 29.2. (Version 1: masked 14-16 and 0, unmasked 0-1 and 14-16.)
    """
    mask = np.zeros((64, 64), np.uint8)
    mask[:, 32:] = 255
    batch = edits(
        3,
        lambda s, rng: Scene(
            another(rng, s.colour, s.background), s.shape, s.background
        ),
    )
    left = np.zeros((64, 64), bool)
    left[:, :32] = True
    scores = {}
    for name, m in (("masked", mask), ("unmasked", None)):
        done = run(engine, batch, strength=1.0, mask=m)
        colours = [object_colour(e.output[:, :32], e.scene.background) for e in done]
        scores[name] = {
            "input colour": sum(
                c == e.scene.colour for c, e in zip(colours, done, strict=True)
            ),
            "prompt colour": sum(
                c == e.prompt.colour for c, e in zip(colours, done, strict=True)
            ),
            "difference": round(mad(done, left), 1),
        }
    masked, unmasked = scores["masked"], scores["unmasked"]
    assert masked["input colour"] >= 9 and masked["prompt colour"] <= 3, scores
    assert unmasked["input colour"] <= 2 and unmasked["prompt colour"] >= 12, scores
    assert masked["difference"] <= 18 and unmasked["difference"] >= 22, scores
