"""The toy prompter's task: expand a short prompt into a full prompt of the toy models'
grammars.

A short prompt names a shape and, optionally, its colour, a motion and a background, in
the toy grammars' order:

    short := ["a"] [colour] shape ["moving" direction] ["on" colour | "on a" colour
    "background"]

``expand`` fills in what is missing and writes the toy-shapes prompt ("a {colour}
{shape} on a {colour} background") or, with a motion, the toy-motion one ("a {colour}
{shape} moving {direction} on a {colour} background"). The object's colour defaults to
red (white on a red background); the background defaults to a fixed colour per object
colour (``DEFAULT_BACKGROUND``, never the object's own). A full grammar prompt is a
short prompt that names everything, so it expands to itself; a short prompt whose object
and background colours are the same names no scene of the grammars and is refused. Only
the toy grammars' vocabularies are imported.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from diffserve.zoo.toy_motion.grammar import DIRECTIONS
from diffserve.zoo.toy_shapes.grammar import COLOURS, SHAPES

__all__ = [
    "DEFAULT_BACKGROUND",
    "DEFAULT_COLOUR",
    "HELD_OUT_MOTIONS",
    "HELD_OUT_OBJECTS",
    "SYSTEM_PROMPT",
    "ShortPrompt",
    "corpus",
    "expand",
    "held_out_pairs",
    "is_held_out",
    "parse_short",
    "short_prompts",
    "training_pairs",
]

SYSTEM_PROMPT = "Expand the user's short prompt into a full toy scene description."
DEFAULT_COLOUR = "red"
# the object's default colour where the background is the default colour itself
DEFAULT_COLOUR_ON_RED = "white"
# The background of an object whose prompt names none: high contrast, and red-on-blue,
# yellow-on-purple and white-on-green are the toy-shapes marker's example prompts (drawn
# right by the shipped weights).
DEFAULT_BACKGROUND: dict[str, str] = {
    "red": "blue",
    "green": "black",
    "blue": "white",
    "yellow": "purple",
    "purple": "yellow",
    "orange": "black",
    "white": "green",
    "black": "orange",
}
# Held out of training: every short prompt whose expansion draws one of these objects or
# motions (so the held-out set tests composition: each colour, shape and direction is
# seen in training, never these pairs of them).
HELD_OUT_OBJECTS = (
    ("green", "circle"),
    ("blue", "square"),
    ("yellow", "triangle"),
    ("purple", "star"),
    ("orange", "ring"),
    ("black", "circle"),
)
HELD_OUT_MOTIONS = (("circle", "up"), ("star", "left"), ("ring", "down"))


@dataclass(frozen=True)
class ShortPrompt:
    """What a short prompt names (None: left to the defaults) and how it words the
    background."""

    colour: str | None
    shape: str
    direction: str | None
    background: str | None
    article: bool = False  # a leading "a"
    # "on a {colour} background" rather than "on {colour}".
    long_background: bool = False

    @property
    def text(self) -> str:
        words = ["a"] if self.article else []
        words += [w for w in (self.colour, self.shape) if w is not None]
        if self.direction is not None:
            words += ["moving", self.direction]
        if self.background is not None:
            words += (
                ["on", "a", self.background, "background"]
                if self.long_background
                else ["on", self.background]
            )
        return " ".join(words)


def parse_short(short: str) -> ShortPrompt:
    """The short prompt's parts; ValueError for text outside the short grammar
    (lower-case words, single spaces)."""
    words = short.split(" ")
    i = 0

    def take(*options: str) -> str | None:
        nonlocal i
        if i < len(words) and words[i] in options:
            i += 1
            return words[i - 1]
        return None

    article = take("a") is not None
    colour = take(*COLOURS)
    shape = take(*SHAPES)
    if shape is None:
        raise ValueError(
            f"not a short toy prompt (no shape where one belongs): {short!r}"
        )
    direction = None
    if take("moving"):
        direction = take(*DIRECTIONS)
        if direction is None:
            raise ValueError(
                f"not a short toy prompt ('moving' takes {', '.join(DIRECTIONS)}): "
                f"{short!r}"
            )
    background, long_background = None, False
    if take("on"):
        long_background = take("a") is not None
        background = take(*COLOURS)
        if background is None or (long_background and take("background") is None):
            raise ValueError(
                "not a short toy prompt (write 'on {colour}' or 'on "
                "a {colour} background'): "
                f"{short!r}"
            )
    if i != len(words):
        raise ValueError(
            f"not a short toy prompt (unexpected {' '.join(words[i:])!r}): {short!r}"
        )
    if colour is not None and colour == background:
        raise ValueError(f"the object and the background are both {colour}: {short!r}")
    return ShortPrompt(colour, shape, direction, background, article, long_background)


def expand(short: str) -> str:
    """The full toy-shapes (no motion) or toy-motion prompt that ``short`` asks for (the
    module's rule)."""
    parts = parse_short(short)
    colour = parts.colour
    if colour is None:
        colour = (
            DEFAULT_COLOUR_ON_RED
            if parts.background == DEFAULT_COLOUR
            else DEFAULT_COLOUR
        )
    background = (
        parts.background if parts.background is not None else DEFAULT_BACKGROUND[colour]
    )
    motion = f" moving {parts.direction}" if parts.direction is not None else ""
    return f"a {colour} {parts.shape}{motion} on a {background} background"


def short_prompts() -> list[str]:
    """Every short prompt of the grammar, in a fixed order (6,850)."""
    out = []
    backgrounds: list[tuple[str | None, bool]] = [(None, False)]
    backgrounds += [(b, long) for b in COLOURS for long in (False, True)]
    for article in (False, True):
        for colour in (None, *COLOURS):
            for shape in SHAPES:
                for direction in (None, *DIRECTIONS):
                    for background, long in backgrounds:
                        if colour is None or colour != background:
                            out.append(
                                ShortPrompt(
                                    colour, shape, direction, background, article, long
                                ).text
                            )
    return out


def is_held_out(short: str) -> bool:
    """Whether ``short``'s expansion draws a held-out object or motion (never in
    ``training_pairs``)."""
    words = expand(short).split()
    colour, shape = words[1], words[2]
    return (colour, shape) in HELD_OUT_OBJECTS or (
        words[3] == "moving" and (shape, words[4]) in HELD_OUT_MOTIONS
    )


def training_pairs() -> list[tuple[str, str]]:
    """(short, expand(short)) for every short prompt that is not held out, in a fixed
    order."""
    return [(s, expand(s)) for s in short_prompts() if not is_held_out(s)]


def held_out_pairs(limit: int | None = None, seed: int = 0) -> list[tuple[str, str]]:
    """(short, expand(short)) for the held-out short prompts: all of them in a fixed
    order, or ``limit`` of them drawn with ``seed`` (the same ones on every call)."""
    pairs = [(s, expand(s)) for s in short_prompts() if is_held_out(s)]
    if limit is None or limit >= len(pairs):
        return pairs
    return [
        pairs[i] for i in sorted(random.Random(seed).sample(range(len(pairs)), limit))
    ]


def corpus() -> str:
    """Text holding every word the prompter reads or writes (the tokenizer's vocabulary:
    one token per word)."""
    words = ["a", "moving", "on", "background", *COLOURS, *SHAPES, *DIRECTIONS]
    # A short prompt's first word follows the chat template's newline, where Qwen's
    # pre-tokenizer gives it no leading space ("red", not "Ġred"). The tokenizer joins
    # its corpus with spaces, so a bare word gets its merges only after a character that
    # is split off from it: a digit ("0red" pre-tokenizes as "0", "red").
    bare = " ".join(f"0{word}" for word in words)
    return " ".join(words) + " " + bare + "\n" + SYSTEM_PROMPT + "\n"
