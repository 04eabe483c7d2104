"""(l) Step cache on a trained model against a random one: the same architecture, requests, backends and
thresholds on the trained toy-shapes FLUX.1 (``diffserve.zoo.flux.toy_model_dir``) and on its random
twin, whose transformer is the one training started from (``random_twin``: same config, seed and
construction as ``zoo/toy_shapes/train.py``, every other component copied). The only difference
between the two is training, so the section shows how far a random-weight model's step-cache figures
(sections h, the quality gate's small-flux) are from a trained model's.

Per (model, backend) one Engine (``cache.backend``, per-request ``cache_threshold``, 0 = uncached). Every
prompt/seed pair runs once per threshold; the points are interleaved per pair (A B ... then ... B A), and
a point's time per image is the median over the pairs. Before that, an untimed probe pass per pair at a
threshold no signal falls under (every step computes, signals traced) gives the per-step signal an
uncached run sees. PSNR, SSIM and the grammar checker's reading are per image, against the same
engine's uncached image of the same pair.
"""

from __future__ import annotations

import gc
import hashlib
import json
import random
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import median, psnr, spread, ssim, to_array
from benchmarks.models import DEFAULT_CACHE
from benchmarks.section import Section, Unavailable
from benchmarks.settings import Case, Settings

DTYPE = "float32"
BACKENDS = ("fbcache", "teacache")
DEFAULTS = {"fbcache": 0.08, "teacache": 0.6}  # the published defaults (docs/cache.md)
PROBE = 1e-9  # cache on, but no signal falls below it: every step computes and is traced
TRAINED, RANDOM = "trained", "random"
TWIN_DIR = "toy-shapes-random"
TWIN_VERSION = 1  # bump when random_twin writes something else
PAIRS_SEED, SEED_BASE = 30, 3_000_000  # held out: training and the test suite use other seeds
SIGNALS_SHOWN = 8


@dataclass
class Point:
    """One threshold on one engine: its per-pair seconds, images and cache entries (in pair order)."""

    threshold: float  # 0 = uncached
    seconds: list[float] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)


def held_out_pairs(n: int) -> list[tuple[str, int]]:
    """``n`` seeded prompt/seed pairs of the toy grammar, the same on every run and for both models."""
    from diffserve.zoo.toy_shapes.grammar import all_scenes

    rng = random.Random(PAIRS_SEED)
    scenes = all_scenes()
    return [(rng.choice(scenes).prompt, SEED_BASE + i) for i in range(n)]


def random_twin(trained: Path, out: Path) -> Path:
    """``trained`` with its transformer replaced by the weights its training started from: the same
    ``FluxTransformer2DModel`` config, built under ``component_seed(seed, "transformer")`` as the trainer
    does, saved as safetensors. Built once; rebuilt when the trained weights or this builder change."""
    from diffusers import FluxTransformer2DModel

    from diffserve.zoo.components import MARKER_FILE, save_components
    from diffserve.zoo.publish import build_into

    marker = json.loads((trained / MARKER_FILE).read_text(encoding="utf-8"))
    source = hashlib.sha256((trained / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes()).hexdigest()
    with_marker = {**marker, "kind": TWIN_DIR, "random_weights": True, "twin_version": TWIN_VERSION,
                   "twin_of": source, "description": f"{marker.get('kind')} with its untrained transformer"}
    try:
        if json.loads((out / MARKER_FILE).read_text(encoding="utf-8")) == with_marker:
            return out
    except (OSError, ValueError):
        pass
    config = dict(FluxTransformer2DModel.load_config(str(trained / "transformer")))

    def write(staging: Path) -> None:
        for item in trained.iterdir():
            if item.name in ("transformer", MARKER_FILE, "loss.png", "training.json"):
                continue
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, staging / item.name)
        save_components({"transformer": lambda: FluxTransformer2DModel.from_config(config)}, staging,
                        int(marker.get("seed", 0)))
        (staging / MARKER_FILE).write_text(json.dumps(with_marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    return build_into(out, write, force=True)


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    from diffserve.zoo.flux import toy_model_dir

    case = settings.cache_trained_case
    trained = toy_model_dir()
    cache_dir = next(iter(models.values())).parent if models else DEFAULT_CACHE
    paths = {TRAINED: trained, RANDOM: random_twin(trained, cache_dir / TWIN_DIR)}
    pairs = held_out_pairs(settings.cache_trained_pairs)
    sweeps = {"fbcache": settings.cache_trained_fbcache, "teacache": settings.cache_trained_teacache}
    section.notes.append(
        f"toy-shapes {case.size}x{case.size}/{case.steps} steps, guidance 0, {DTYPE}, eager, one request at a "
        f"time; {len(pairs)} held-out prompt/seed pairs (the same for every point), T5 at its full 512-token "
        f"window (the model's training saw that attention). trained: the shipped weights; random: the same "
        f"directory with the transformer its training started from (same config, seed and init). Cache rules: "
        f"the stage defaults (first step and last step computed, no cap on consecutive skips). Per point: "
        f"median s/image over the pairs (interleaved, after {settings.warmup} untimed 1-step warm-up); skipped "
        f"steps and SSIM (11x11 Gaussian, luminance) as means over the pairs, PSNR over all pairs' pixels "
        f"(one pooled MSE), against the same engine's uncached image of each pair; checker = images the grammar's checker reads as their prompt (meaningless "
        f"for the random model, which draws noise). Signal = the median over pairs and steps of the per-step "
        f"value compared with the threshold in an uncached run (untimed probe at threshold {PROBE:g}: every step "
        f"computes); teacache's is its rescaled value, which it accumulates until a step computes.")
    section.columns = ["model", "backend", "threshold", "median signal per step (uncached)", "skipped steps (mean)",
                       "median s/image", "spread ±", "runs", "speed-up vs own uncached",
                       "PSNR vs own uncached (dB, all pairs)", "SSIM vs own uncached (mean)", "checker agrees"]
    for model, path in paths.items():
        for backend in (b for b in BACKENDS if sweeps[b]):  # a backend without thresholds is not measured
            thresholds = tuple(sorted(set(sweeps[backend])))
            points, signals = _measure_engine(path, case, backend, thresholds, pairs, settings)
            _report(section, model, backend, points, signals, pairs, case.steps)
            del points
            gc.collect()
    section.metrics["cache_trained.case"] = f"toy-shapes {case.size}x{case.size}/{case.steps} steps"


def _request(prompt: str, seed: int, steps: int, size: int, threshold: float) -> Any:
    from diffserve import GenerationRequest

    return GenerationRequest(prompt=prompt, height=size, width=size, num_inference_steps=steps,
                             guidance_scale=0.0, seed=seed, n=1, cache_threshold=threshold)


def _measure_engine(path: Path, case: Case, backend: str, thresholds: tuple[float, ...],
                    pairs: list[tuple[str, int]], settings: Settings) -> tuple[list[Point], list[list[float]]]:
    """Warm up, probe every pair's signals, then time every threshold on every pair, interleaved."""
    engine = C.load_engine(path, DTYPE, enforce_eager=True,
                           cache={"backend": backend, "threshold": DEFAULTS[backend],
                                  "max_threshold": max((1.0, *thresholds))})
    try:
        for _ in range(settings.warmup):
            engine.generate(_request(pairs[0][0], pairs[0][1], 1, case.size, 0.0))
        signals = []
        for prompt, seed in pairs:
            entry = _entry(engine.generate(_request(prompt, seed, case.steps, case.size, PROBE)))
            if entry["skipped_steps"]:
                raise AssertionError(f"the probe threshold {PROBE} skipped a step: {entry}")
            signals.append([float(s) for _, s, _ in entry["trace"] if s is not None])
        points = [Point(t) for t in (0.0, *thresholds)]
        for i, (prompt, seed) in enumerate(pairs):
            for point in points if i % 2 == 0 else points[::-1]:
                request = _request(prompt, seed, case.steps, case.size, point.threshold)
                t0 = time.perf_counter()
                output = engine.generate(request)
                point.seconds.append(time.perf_counter() - t0)
                point.images.append(output.images[0])
                point.entries.append(_entry(output) if point.threshold else {"skipped_steps": 0})
    finally:
        C.shutdown(engine)
    return points, signals


def _entry(output: Any) -> dict[str, Any]:
    entries = (getattr(output, "attestation", None) or {}).get("cache")
    if not entries:
        raise Unavailable("diffserve output has no attestation['cache'] entry")
    return entries[0]


def summarise(points: list[Point], pairs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """Per point: median s/image, speed-up, mean skipped steps, mean PSNR/SSIM against the uncached
    point's image of the same pair (``points[0]``), and how many images the checker reads as their prompt."""
    from diffserve.zoo.toy_shapes.grammar import classify, parse_prompt

    base = points[0]
    base_s = median(base.seconds)
    rows = []
    for point in points:
        cached = point is not base
        similarity = [ssim(a, b) for a, b in zip(point.images, base.images, strict=True)] if cached else [1.0]
        agree = sum(classify(image) == parse_prompt(prompt) for (prompt, _), image in zip(pairs, point.images,
                                                                                         strict=True))
        rows.append({
            "threshold": point.threshold, "median_s": median(point.seconds), "spread": spread(point.seconds),
            "runs": len(point.seconds), "speedup": base_s / median(point.seconds),
            "skipped": statistics.fmean(e["skipped_steps"] for e in point.entries),
            "psnr_db": pooled_psnr(point.images, base.images), "ssim": statistics.fmean(similarity),
            "agree": agree, "pairs": len(pairs),
        })
    return rows


def pooled_psnr(images: list[Any], references: list[Any]) -> float:
    """PSNR over the pixels of all pairs together (one pooled MSE): finite as soon as one image differs,
    where a mean of per-image PSNRs would be infinite whenever one image is identical."""
    import numpy as np

    return psnr(np.concatenate([to_array(x) for x in images]), np.concatenate([to_array(x) for x in references]))


def _report(section: Section, model: str, backend: str, points: list[Point], signals: list[list[float]],
            pairs: list[tuple[str, int]], steps: int) -> None:
    flat = [s for row in signals for s in row]
    signal = median(flat)
    prefix = f"cache_trained.{model}.{backend}"
    section.metrics[f"{prefix}.signal_median"] = signal
    for row in summarise(points, pairs):
        threshold = row["threshold"]
        label = "uncached" if threshold == 0 else f"{threshold:g}" + (" (default)" if threshold == DEFAULTS[backend]
                                                                        else "")
        section.add(model, backend, label, round(signal, 3), f"{row['skipped']:.1f}/{steps}", round(row["median_s"], 3),
                    f"{row['spread']:.0%}", row["runs"], f"{row['speedup']:.2f}x",
                    _db(row["psnr_db"]) if threshold else "", f"{row['ssim']:.4f}" if threshold else "",
                    f"{row['agree']}/{row['pairs']}")
        key = f"{prefix}.{'uncached' if threshold == 0 else f't{threshold:g}'}"
        for name in ("median_s", "speedup", "skipped", "psnr_db", "ssim", "agree"):
            section.metrics[f"{key}.{name}"] = row[name]
    first = [round(s, 3) for s in signals[0][:SIGNALS_SHOWN]] if signals else []
    section.notes.append(f"{model} {backend}: signals per step {min(flat, default=0):.3f}-{max(flat, default=0):.3f} "
                         f"(median {signal:.3f}); first pair, steps 2-{len(first) + 1}: {first}")


def _db(value: float) -> str:
    return "identical" if value == float("inf") else f"{value:.1f}"
