"""(q) Step cache on the trained toy video model against a random one: section l's
comparison on video. The trained toy-motion Wan2.1
(``diffserve.zoo.wan.toy_motion_dir``: 64x64, 17 frames at 8 fps, "a {colour} {shape}
moving {direction} on a {colour} background") and its random twin, the same directory
with the transformer its training started from (``random_twin``: the trainer's config,
seed and construction, ``zoo/toy_motion/train.py``; every other component copied), run
the same held-out prompt/seed pairs at the same thresholds.

Per (model, backend) one Engine (``cache.backend``, per-request ``cache_threshold``, 0 =
uncached), measured by ``cache_sweep`` exactly as section l: an untimed probe per pair
(every step computes, signals traced), then every threshold on every pair, interleaved
per pair. Quality is per video against the same engine's uncached video of the same
pair: PSNR over every frame of every pair pooled, SSIM the mean over frames, and the
toy-motion checker's reading of the clip (``checker.read_clip``): whether it reads the
whole prompt back, and whether it reads the direction right (what skipping steps is
likeliest to cost a clip: the object's motion is the fine detail).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import cache_sweep
from benchmarks.cache_sweep import DTYPE, TRAINED, Point, Sweep, method_note
from benchmarks.section import Section
from benchmarks.settings import Case, Settings

# FPS, FRAMES: the request defaults.
from diffserve.zoo.toy_motion.grammar import FPS, FRAMES, all_scenes

# Published defaults (docs/cache.md): fbcache's (ParaAttention), teacache's for
# Wan2.1-T2V-1.3B (TeaCache4Wan2.1).
DEFAULTS = {"fbcache": 0.08, "teacache": 0.08}
# toy-motion's shape has no fitted TeaCache polynomial ("auto" refuses teacache): name
# the published one for Wan2.1-T2V-1.3B (the same probe, the timestep embedding; fitted
# on another checkpoint).
COEFFICIENTS = "wan2.1-t2v-1.3b"
TWIN_DIR = "toy-motion-random"
TWIN_VERSION = 1  # bump when random_twin writes something else
# Held out: training draws clips from random.Random(seed) and its noise from its own
# generators; the model's own evaluation (zoo/toy_motion/evaluate.py) takes seeds from
# 5_000_000 (+100_000 per seed set).
PAIRS_SEED, SEED_BASE = 31, 7_000_000


def held_out_pairs(n: int) -> list[tuple[str, int]]:
    """``n`` seeded prompt/seed pairs of the toy-motion grammar, the same on every run
    and for both models."""
    return cache_sweep.held_out_pairs(all_scenes(), n, PAIRS_SEED, SEED_BASE)


def random_twin(trained: Path, out: Path) -> Path:
    """``trained`` with its transformer replaced by the one its training started from:
    ``WanTransformer3DModel`` of the trained config, built under ``component_seed(seed,
    "transformer")`` as ``_train_into`` does (the EMA copy is made after construction
    and draws nothing). Built once; rebuilt when the trained weights change."""
    from diffusers import WanTransformer3DModel

    return cache_sweep.random_twin(
        trained, out, WanTransformer3DModel, TWIN_DIR, TWIN_VERSION
    )


def read_video(output: Any) -> Any:
    """A RequestOutput's video as uint8 [frames, H, W, 3]."""
    import numpy as np

    return np.asarray(output.videos[0])


def checks(prompt: str, video: Any) -> dict[str, bool]:
    """The checker's verdicts on one clip: the whole prompt read back, and its
    direction."""
    from diffserve.zoo.toy_motion.checker import read_clip
    from diffserve.zoo.toy_motion.grammar import parse_prompt

    asked, read = parse_prompt(prompt), read_clip(list(video)).scene
    return {"agree": read == asked, "direction": read.direction == asked.direction}


def request_defaults(trained: Path) -> dict[str, Any]:
    """The model's own request defaults (its marker file): frames, fps and guidance of
    every request here."""
    import json

    from diffserve.zoo.components import MARKER_FILE

    marker = json.loads((trained / MARKER_FILE).read_text(encoding="utf-8"))
    return {
        "num_frames": FRAMES,
        "fps": FPS,
        "guidance_scale": 1.0,
        **marker.get("request_defaults", {}),
    }


def sweep(
    pairs: list[tuple[str, int]],
    case: Case = Case("toy-motion", 64, 24),
    warmup: int = 1,
    model_defaults: dict[str, Any] | None = None,
) -> Sweep:
    """Section q's requests (``case``'s size and steps; frames, fps and guidance of
    ``model_defaults``, the model's ``request_defaults``: 17 frames, 8 fps, guidance
    1.0) and readings (the toy-motion checker)."""
    given = {
        "num_frames": FRAMES,
        "fps": FPS,
        "guidance_scale": 1.0,
        **(model_defaults or {}),
    }

    def request(prompt: str, seed: int, steps: int, threshold: float) -> Any:
        from diffserve import GenerationRequest

        return GenerationRequest(
            prompt=prompt,
            height=case.size,
            width=case.size,
            num_frames=given["num_frames"],
            fps=given["fps"],
            num_inference_steps=steps,
            guidance_scale=given["guidance_scale"],
            seed=seed,
            n=1,
            cache_threshold=threshold,
        )

    return Sweep(
        prefix="cache_video",
        unit="video",
        steps=case.steps,
        pairs=pairs,
        request=request,
        output=read_video,
        frames=list,
        checks=checks,
        labels={"agree": "checker agrees", "direction": "direction right"},
        defaults=DEFAULTS,
        cache={"teacache": {"teacache_coefficients": COEFFICIENTS}},
        warmup=warmup,
    )


def summarise(
    points: list[Point], pairs: list[tuple[str, int]]
) -> list[dict[str, Any]]:
    """Per point: ``cache_sweep.summarise`` over the videos' frames, with both checker
    counts."""
    return cache_sweep.summarise(points, sweep(pairs))


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    from diffserve.zoo.wan import toy_motion_dir

    measure_model(section, settings, toy_motion_dir(), models)


def measure_model(
    section: Section, settings: Settings, trained: Path, models: dict[str, Path]
) -> None:
    """Section q on the trained toy-motion directory ``trained``; its random twin is
    built beside ``models`` (the run's built models; the default model cache without
    any)."""
    case = settings.cache_video_case
    paths = cache_sweep.models(trained, random_twin, TWIN_DIR, models)
    pairs = held_out_pairs(settings.cache_video_pairs)
    given = request_defaults(trained)
    guidance = float(given["guidance_scale"])
    section.notes.append(
        f"toy-motion {case.size}x{case.size}, {given['num_frames']} "
        f"frames at {given['fps']} fps, {case.steps} steps "
        f"(the model's default is {given.get('num_inference_steps')}), "
        f"guidance {guidance:g} (the model's default: "
        f"{'no CFG branch' if guidance == 1 else 'CFG, each branch deciding alone'}), "
        f"{DTYPE}, eager, one request "
        f"at a time; {len(pairs)} held-out prompt/seed pairs "
        f"(the same for every point). {TRAINED}: the toy-motion "
        "weights; teacache uses the published polynomial of "
        "Wan2.1-T2V-1.3B (cache.teacache_coefficients: "
        f"{COEFFICIENTS}; toy-motion's shape has no fit of its "
        "own, so its rescaled values are on that checkpoint's "
        f"scale, not this model's); fbcache needs none. "
        f"{method_note(settings.warmup, 'video')} checker = "
        "clips the toy-motion checker reads as their whole "
        "prompt; "
        "direction = clips whose motion it reads as asked (both "
        "meaningless for the random model)."
    )
    cache_sweep.run(
        section,
        sweep(pairs, case, settings.warmup, given),
        paths,
        {
            "fbcache": settings.cache_video_fbcache,
            "teacache": settings.cache_video_teacache,
        },
    )
    section.metrics["cache_video.case"] = (
        f"toy-motion {case.size}x{case.size}x{given['num_frames']}/{case.steps} "
        f"steps, guidance {guidance:g}"
    )
