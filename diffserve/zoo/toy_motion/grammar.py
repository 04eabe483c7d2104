"""The toy-motion grammar: "a {colour} {shape} moving {direction} on a {colour}
background".

toy-shapes' 8 colours and 5 shapes, 4 directions: 8 x 7 x 5 x 4 = 1120 prompts. A clip
is 17 frames (4k + 1, a whole number of Wan's 4-frame latent steps after the first
frame) of 64x64 in which the shape crosses part of the frame at constant speed; its
size, speed, start and the cross-axis position are jittered. Only PIL (inside the
functions).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from diffserve.zoo.toy_shapes.grammar import COLOURS, SHAPES, SIZE, Scene, draw_shape

DIRECTIONS: dict[str, tuple[int, int]] = {
    "left": (-1, 0),
    "right": (1, 0),
    "up": (0, -1),
    "down": (0, 1),
}
FRAMES = 17
FPS = 8
# The shape's radius in pixels. Why not smaller: at Wan's 8x spatial compression a
# radius of 9-12 px spans ~3 latent cells and the VAE rounds every corner (measured: the
# checker read the per-frame VAE's reconstructions of held-out clips as the right shape
# 38% of the time; squares, triangles and stars came back as circles); at 13-16 px, 81%
# with the same VAE and training (toy-shapes draws 15-22 px for the same reason).
# 13-16 px: the transformer drew squares as circles and rings as stars
# (docs/toy-model.md).
RADIUS = (15.0, 19.0)
# How far its centre moves over the clip, in pixels (the whole shape stays in frame).
TRAVEL = (14.0, 18.0)
_START_JITTER = 2.0  # along the motion, around the centred path
_CROSS_JITTER = 6.0  # across it


@dataclass(frozen=True)
class MotionScene:
    """One prompt of the grammar."""

    colour: str
    shape: str
    direction: str
    background: str

    @property
    def prompt(self) -> str:
        return (
            f"a {self.colour} {self.shape} moving {self.direction} "
            f"on a {self.background} background"
        )

    @property
    def still(self) -> Scene:
        """The frame's scene as toy-shapes names it (no motion)."""
        return Scene(self.colour, self.shape, self.background)


def all_scenes() -> list[MotionScene]:
    """Every prompt (the object's colour differs from the background's): 1120."""
    return [
        MotionScene(c, s, d, b)
        for b in COLOURS
        for c in COLOURS
        if c != b
        for s in SHAPES
        for d in DIRECTIONS
    ]


def grammar_corpus() -> str:
    """Text that holds every word of the grammar (the tokenizer's vocabulary: one token
    per word)."""
    words = ["a", "moving", "on", "background", *COLOURS, *SHAPES, *DIRECTIONS]
    return "\n".join([*words, *(s.prompt for s in all_scenes())]) + "\n"


def parse_prompt(prompt: str) -> MotionScene:
    words = prompt.split()
    if (
        len(words) != 9
        or words[0] != "a"
        or words[3] != "moving"
        or words[5:7] != ["on", "a"]
        or words[8] != "background"
        or words[1] not in COLOURS
        or words[7] not in COLOURS
        or words[2] not in SHAPES
        or words[4] not in DIRECTIONS
    ):
        raise ValueError(f"not a toy-motion prompt: {prompt!r}")
    return MotionScene(words[1], words[2], words[4], words[7])


def draw_clip(
    scene: MotionScene, rng: random.Random, frames: int = FRAMES
) -> list[Any]:
    """``scene`` as ``frames`` 64x64 RGB PIL images: the shape moves at constant speed
    in its direction."""
    radius = rng.uniform(*RADIUS)
    travel = rng.uniform(*TRAVEL)
    dx, dy = DIRECTIONS[scene.direction]
    along = rng.uniform(-_START_JITTER, _START_JITTER)
    across = rng.uniform(-_CROSS_JITTER, _CROSS_JITTER)
    # The path is centred on the frame (up to the jitters): start half the travel behind
    # the centre.
    start = SIZE / 2 - travel / 2 + along
    out = []
    for i in range(frames):
        t = start + travel * i / max(frames - 1, 1)
        x = SIZE / 2 + across if dx == 0 else (t if dx > 0 else SIZE - t)
        y = SIZE / 2 + across if dy == 0 else (t if dy > 0 else SIZE - t)
        out.append(draw_shape(scene.still, x, y, radius))
    return out
