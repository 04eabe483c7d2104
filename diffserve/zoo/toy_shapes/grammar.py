"""The toy-shapes grammar: prompts, a procedural drawer and a checker that reads a
drawing back.

"a {colour} {shape} on a {colour} background", 8 flat colours and 5 shapes, drawn at
64x64. The checker is what proves that a trained model draws: background = the dominant
colour of the border, object = the dominant other colour, shape = the template (drawn
into the bounding box of the object's largest blob) that overlaps it best. Only numpy
and PIL (imported inside the functions).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "purple": (140, 40, 180),
    "orange": (245, 130, 20),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "star", "ring")
SIZE = 64
# Solidity (area / convex hull area) under which an object is star-like: drawn circles
# measure 0.96-0.97, triangles 0.92-0.94, rings 0.65-0.68, stars 0.55-0.63; the toy
# model's circles 0.92-0.97, its stars ~0.82.
STAR_LIKE = 0.88
_SUPERSAMPLE = 4


@dataclass(frozen=True)
class Scene:
    """One prompt of the grammar."""

    colour: str
    shape: str
    background: str

    @property
    def prompt(self) -> str:
        return f"a {self.colour} {self.shape} on a {self.background} background"


def all_scenes() -> list[Scene]:
    """Every prompt of the grammar (object colour differs from the background): 8 x 7 x
    5 = 280."""
    return [Scene(c, s, b) for b in COLOURS for c in COLOURS if c != b for s in SHAPES]


def grammar_corpus() -> str:
    """Text that holds every word of the grammar (for the tokenizers' vocabularies)."""
    return "\n".join(s.prompt for s in all_scenes()) + "\n"


def parse_prompt(prompt: str) -> Scene:
    words = prompt.split()
    if (
        len(words) != 7
        or words[0] != "a"
        or words[3:5] != ["on", "a"]
        or words[6] != "background"
    ):
        raise ValueError(f"not a toy-shapes prompt: {prompt!r}")
    return Scene(words[1], words[2], words[5])


def draw(scene: Scene, rng: random.Random) -> Any:
    """Draw ``scene`` as a 64x64 RGB PIL image; position and size jitter come from
    ``rng``."""
    radius = rng.uniform(15.0, 22.0)
    cx = SIZE / 2 + rng.uniform(-5.0, 5.0)
    cy = SIZE / 2 + rng.uniform(-5.0, 5.0)
    return draw_shape(scene, cx, cy, radius)


def draw_shape(
    scene: Scene, cx: float, cy: float, radius: float, size: int = SIZE
) -> Any:
    """``scene``'s shape centred at (``cx``, ``cy``) with ``radius`` (pixels) on its
    background, as a ``size`` x ``size`` RGB PIL image, drawn supersampled and
    box-filtered (soft, anti-aliased edges)."""
    from PIL import Image, ImageDraw

    k = _SUPERSAMPLE
    image = Image.new("RGB", (size * k, size * k), COLOURS[scene.background])
    pen = ImageDraw.Draw(image)
    radius, cx, cy = radius * k, cx * k, cy * k
    fill = COLOURS[scene.colour]
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    if scene.shape == "circle":
        pen.ellipse(box, fill=fill)
    elif scene.shape == "square":
        half = radius * 0.85
        pen.rectangle((cx - half, cy - half, cx + half, cy + half), fill=fill)
    elif scene.shape == "triangle":
        pen.polygon(
            [
                (cx, cy - radius),
                (cx + radius, cy + radius * 0.8),
                (cx - radius, cy + radius * 0.8),
            ],
            fill=fill,
        )
    elif scene.shape == "star":
        points = []
        for i in range(10):
            r = radius if i % 2 == 0 else radius * 0.45
            angle = -math.pi / 2 + i * math.pi / 5
            points.append((cx + r * math.cos(angle), cy + r * math.sin(angle)))
        pen.polygon(points, fill=fill)
    elif scene.shape == "ring":
        pen.ellipse(box, fill=fill)
        inner = radius * 0.55
        pen.ellipse(
            (cx - inner, cy - inner, cx + inner, cy + inner),
            fill=COLOURS[scene.background],
        )
    else:
        raise ValueError(f"unknown shape {scene.shape!r}")
    return image.resize((size, size), Image.Resampling.BOX)


def classify(image: Any) -> Scene:
    """Read a drawing back: (object colour, shape, background colour) as the grammar
    names them.

    Shape: the template that overlaps the object best, except that a "circle" whose
    solidity is under ``STAR_LIKE`` is a star (a star with fat arms overlaps a circle's
    template best, but no circle is that concave).
    """
    found = segment(image)
    if found is None:
        return Scene("none", "none", _background_name(image))
    colour, background, blob = found
    shape = shape_of(blob)
    if shape == "circle" and solidity_of(blob) < STAR_LIKE:
        shape = "star"
    return Scene(colour, shape, background)


def solidity(image: Any) -> float:
    """The object's area over its convex hull's: about 0.96 for drawn circles, 1.0 for
    squares, 0.6 for stars (1.0 when there is no object). A shape measure that needs no
    template."""
    found = segment(image)
    return 1.0 if found is None else solidity_of(found[2])


def solidity_of(blob: Any) -> float:
    """A blob's area over its convex hull's (``solidity`` without the segmentation)."""
    import numpy as np

    ys, xs = np.nonzero(blob)
    # Every pixel's four corners, so a one-pixel-wide blob still has an area.
    corners = {
        (y + dy, x + dx)
        for y, x in zip(ys.tolist(), xs.tolist(), strict=True)
        for dy in (0, 1)
        for dx in (0, 1)
    }
    return float(len(ys)) / max(_hull_area(sorted(corners)), 1.0)


def segment(image: Any) -> tuple[str, str, Any] | None:
    """(object colour, background colour, the object colour's largest blob), or None
    without an object."""
    import numpy as np

    labels = palette_labels(image)
    names = list(COLOURS)
    background = _border_colour(labels)
    inner = labels[labels != background]
    if inner.size == 0:
        return None
    colour = int(np.bincount(inner, minlength=len(names)).argmax())
    return names[colour], names[background], _largest_component(labels == colour)


def palette_labels(image: Any) -> Any:
    """[H, W] index into ``COLOURS`` of each pixel's nearest palette colour (a PIL image
    or uint8 [H, W, 3])."""
    import numpy as np

    pixels = np.asarray(
        image.convert("RGB") if hasattr(image, "convert") else image, dtype=np.float32
    )
    palette = np.array(list(COLOURS.values()), dtype=np.float32)
    return ((pixels[:, :, None, :] - palette) ** 2).sum(-1).argmin(-1)


def _border_colour(labels: Any) -> int:
    import numpy as np

    border = np.concatenate(
        [
            labels[:2].ravel(),
            labels[-2:].ravel(),
            labels[:, :2].ravel(),
            labels[:, -2:].ravel(),
        ]
    )
    return int(np.bincount(border, minlength=len(COLOURS)).argmax())


def _background_name(image: Any) -> str:
    return list(COLOURS)[_border_colour(palette_labels(image))]


def _hull_area(points: list[tuple[int, int]]) -> float:
    """Area of the convex hull of sorted, distinct points (Andrew's monotone chain, then
    the shoelace)."""

    def turn(o: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> int:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    chains: list[list[tuple[int, int]]] = []
    for ordered in (points, points[::-1]):
        chain: list[tuple[int, int]] = []
        for p in ordered:
            while len(chain) >= 2 and turn(chain[-2], chain[-1], p) <= 0:
                chain.pop()
            chain.append(p)
        chains.append(chain[:-1])
    hull = chains[0] + chains[1]
    return 0.5 * abs(
        sum(
            hull[i][0] * hull[i - 1][1] - hull[i - 1][0] * hull[i][1]
            for i in range(len(hull))
        )
    )


def _largest_component(mask: Any) -> Any:
    """The largest 4-connected blob of ``mask``: the object, without stray specks of its
    colour."""
    import numpy as np

    seen = np.zeros_like(mask, dtype=bool)
    best: list[tuple[int, int]] = []
    h, w = mask.shape
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        stack, blob = [(int(y0), int(x0))], []
        while stack:
            y, x = stack.pop()
            blob.append((y, x))
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        if len(blob) > len(best):
            best = blob
    out = np.zeros_like(mask, dtype=bool)
    if best:
        ys, xs = zip(*best, strict=True)
        out[list(ys), list(xs)] = True
    return out


def shape_of(mask: Any) -> str:
    """The shape whose template, drawn into the blob's bounding box, overlaps the blob
    best (IoU)."""
    import numpy as np
    from PIL import Image, ImageDraw

    ys, xs = np.nonzero(mask)
    if ys.size < 20:
        return "none"
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    box = mask[y0:y1, x0:x1]
    h, w = box.shape
    k = _SUPERSAMPLE
    best, best_iou = "none", -1.0
    for shape in SHAPES:
        template = Image.new("L", (w * k, h * k), 0)
        pen = ImageDraw.Draw(template)
        W, H = w * k, h * k
        if shape in ("circle", "ring"):
            pen.ellipse((0, 0, W - 1, H - 1), fill=255)
            if shape == "ring":
                pen.ellipse((W * 0.225, H * 0.225, W * 0.775, H * 0.775), fill=0)
        elif shape == "square":
            pen.rectangle((0, 0, W - 1, H - 1), fill=255)
        elif shape == "triangle":
            pen.polygon([(W / 2, 0), (W, H), (0, H)], fill=255)
        else:
            rx, ry = (
                W / (2 * math.sin(2 * math.pi / 5)),
                H / (1 + math.cos(math.pi / 5)),
            )
            points = []
            for i in range(10):
                r = 1.0 if i % 2 == 0 else 0.45
                angle = -math.pi / 2 + i * math.pi / 5
                points.append(
                    (W / 2 + r * rx * math.cos(angle), ry + r * ry * math.sin(angle))
                )
            pen.polygon(points, fill=255)
        ref = np.asarray(template.resize((w, h), Image.Resampling.BOX)) >= 128
        iou = (ref & box).sum() / max((ref | box).sum(), 1)
        if iou > best_iou:
            best, best_iou = shape, iou
    return best
