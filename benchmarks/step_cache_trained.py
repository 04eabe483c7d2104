"""(l) Step cache on a trained model against a random one: the same architecture,
requests, backends and thresholds on the trained toy-shapes FLUX.1
(``diffserve.zoo.flux.toy_model_dir``) and on its random twin, whose transformer is the
one training started from (``random_twin``: same config, seed and construction as
``zoo/toy_shapes/train.py``, every other component copied). The only difference between
the two is training, so the section shows how far a random-weight model's step-cache
figures (sections h, the quality gate's small-flux) are from a trained model's.

Per (model, backend) one Engine (``cache.backend``, per-request ``cache_threshold``, 0 =
uncached). Every prompt/seed pair runs once per threshold; the points are interleaved
per pair (A B ... then ... B A), and a point's time per image is the median over the
pairs. Before that, an untimed probe pass per pair at a threshold no signal falls under
(every step computes, signals traced) gives the per-step signal an uncached run sees.
PSNR, SSIM and the grammar checker's reading are per image, against the same engine's
uncached image of the same pair. The sweep itself is ``cache_sweep`` (shared with
section q).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import cache_sweep
from benchmarks.cache_sweep import (
    DTYPE,
    TRAINED,
    Point,
    Sweep,
    method_note,
    pooled_psnr,
)
from benchmarks.section import Section
from benchmarks.settings import Case, Settings

__all__ = [
    "Point",
    "held_out_pairs",
    "measure",
    "pooled_psnr",
    "random_twin",
    "summarise",
]

DEFAULTS = {"fbcache": 0.08, "teacache": 0.6}  # the published defaults (docs/cache.md)
TWIN_DIR = "toy-shapes-random"
TWIN_VERSION = 1  # bump when random_twin writes something else
# Held out: training and the test suite use other seeds.
PAIRS_SEED, SEED_BASE = (30, 3_000_000)


def held_out_pairs(n: int) -> list[tuple[str, int]]:
    """``n`` seeded prompt/seed pairs of the toy grammar, the same on every run and for
    both models."""
    from diffserve.zoo.toy_shapes.grammar import all_scenes

    return cache_sweep.held_out_pairs(all_scenes(), n, PAIRS_SEED, SEED_BASE)


def random_twin(trained: Path, out: Path) -> Path:
    """``trained`` with its transformer replaced by the weights its training started
    from: the same ``FluxTransformer2DModel`` config, built under ``component_seed(seed,
    "transformer")`` as the trainer does, saved as safetensors. Built once; rebuilt when
    the trained weights or this builder change."""
    from diffusers import FluxTransformer2DModel

    return cache_sweep.random_twin(
        trained, out, FluxTransformer2DModel, TWIN_DIR, TWIN_VERSION
    )


def sweep(
    pairs: list[tuple[str, int]],
    case: Case = Case("toy-shapes", 64, 28),
    warmup: int = 1,
) -> Sweep:
    """Section l's requests (64x64 images, guidance 0) and readings (the grammar's
    checker)."""

    def request(prompt: str, seed: int, steps: int, threshold: float) -> Any:
        from diffserve import GenerationRequest

        return GenerationRequest(
            prompt=prompt,
            height=case.size,
            width=case.size,
            num_inference_steps=steps,
            guidance_scale=0.0,
            seed=seed,
            n=1,
            cache_threshold=threshold,
        )

    def checks(prompt: str, image: Any) -> dict[str, bool]:
        from diffserve.zoo.toy_shapes.grammar import classify, parse_prompt

        return {"agree": classify(image) == parse_prompt(prompt)}

    return Sweep(
        prefix="cache_trained",
        unit="image",
        steps=case.steps,
        pairs=pairs,
        request=request,
        output=lambda out: out.images[0],
        frames=lambda image: [image],
        checks=checks,
        labels={"agree": "checker agrees"},
        defaults=DEFAULTS,
        warmup=warmup,
    )


def summarise(
    points: list[Point], pairs: list[tuple[str, int]]
) -> list[dict[str, Any]]:
    """Per point: median s/image, speed-up, mean skipped steps, pooled PSNR and mean
    SSIM against the uncached point's image of the same pair (``points[0]``), and how
    many images the checker reads as their prompt."""
    return cache_sweep.summarise(points, sweep(pairs))


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    from diffserve.zoo.demo import toy_model_dir

    case = settings.cache_trained_case
    paths = cache_sweep.models(toy_model_dir(), random_twin, TWIN_DIR, models)
    pairs = held_out_pairs(settings.cache_trained_pairs)
    section.notes.append(
        f"toy-shapes {case.size}x{case.size}/{case.steps} steps, "
        f"guidance 0, {DTYPE}, eager, one request at a "
        f"time; {len(pairs)} held-out prompt/seed pairs (the "
        "same for every point), T5 at its full 512-token "
        "window (the model's training saw that attention). "
        f"{TRAINED}: the shipped weights; "
        f"{method_note(settings.warmup, 'image')} checker = "
        "images the grammar's checker reads as their prompt "
        f"(meaningless for the random model, which draws noise)."
    )
    cache_sweep.run(
        section,
        sweep(pairs, case, settings.warmup),
        paths,
        {
            "fbcache": settings.cache_trained_fbcache,
            "teacache": settings.cache_trained_teacache,
        },
    )
    section.metrics["cache_trained.case"] = (
        f"toy-shapes {case.size}x{case.size}/{case.steps} steps"
    )
