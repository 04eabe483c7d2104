"""What the step-cache sections on trained toy models (l: toy-shapes, images; q:
toy-motion, videos) share: the random twin of a trained model, the interleaved per-pair
threshold sweep on one Engine per (model, backend), the per-point summary against the
same engine's uncached outputs, and the report rows.

A section describes itself in a ``Sweep``: its held-out prompt/seed pairs, how to build
a request and read an output, the output's frames (one for an image, all of a video's)
and the checker's verdicts on it. Everything else (engine, warm-up, probe, timing,
PSNR/SSIM, metrics, rows) is the same code for both.
"""

from __future__ import annotations

import gc
import hashlib
import json
import random
import shutil
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import median, psnr, spread, ssim, to_array
from benchmarks.section import Section, Unavailable

DTYPE = "float32"
BACKENDS = ("fbcache", "teacache")
# Cache on, but no signal falls below it: every step computes and is traced.
PROBE = 1e-9
TRAINED, RANDOM = "trained", "random"
SIGNALS_SHOWN = 8
# Files of a trained model's directory that say how it was trained: not its random
# twin's.
TRAINING_FILES = ("loss.png", "training.json")


@dataclass
class Point:
    """One threshold on one engine: its per-pair seconds, outputs (images or videos) and
    cache entries (in pair order)."""

    threshold: float  # 0 = uncached
    seconds: list[float] = field(default_factory=list)
    images: list[Any] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Sweep:
    """One section's sweep: its requests, how its outputs are read, and what it names
    its figures."""

    prefix: str  # metric keys: "<prefix>.<model>.<backend>.<point>.<name>"
    unit: str  # "image" | "video": what one request returns
    steps: int
    # Held-out (prompt, seed), the same for every point and model.
    pairs: list[tuple[str, int]]
    # (prompt, seed, steps, threshold) -> GenerationRequest.
    request: Callable[[str, int, int, float], Any]
    output: Callable[[Any], Any]  # RequestOutput -> the image or video kept per pair
    frames: Callable[[Any], list[Any]]  # an output's frames, each a [H, W, 3] image
    # (prompt, output) -> verdict per name of ``labels``.
    checks: Callable[[str, Any], dict[str, bool]]
    labels: Mapping[str, str]  # check name -> its column title
    # Per backend: the published default threshold (marked in the rows)
    defaults: Mapping[str, float]
    # Per backend: more cache config.
    cache: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    warmup: int = 1  # untimed 1-step requests per engine before the probe

    def columns(self) -> list[str]:
        return [
            "model",
            "backend",
            "threshold",
            "median signal per step (uncached)",
            "skipped steps (mean)",
            f"median s/{self.unit}",
            "spread ±",
            "runs",
            "speed-up vs own uncached",
            "PSNR vs own uncached (dB, all pairs)",
            "SSIM vs own uncached (mean)",
            *self.labels.values(),
        ]


def held_out_pairs(
    scenes: list[Any], n: int, pairs_seed: int, seed_base: int
) -> list[tuple[str, int]]:
    """``n`` prompt/seed pairs: prompts of ``scenes`` drawn by
    ``random.Random(pairs_seed)``, seeds from ``seed_base`` on; the same on every run
    and for both models."""
    rng = random.Random(pairs_seed)
    return [(rng.choice(scenes).prompt, seed_base + i) for i in range(n)]


def random_twin(
    trained: Path, out: Path, transformer: Any, kind: str, version: int
) -> Path:
    """``trained`` with its transformer replaced by the weights its training started
    from: the same config (its ``transformer/config.json``), built by
    ``transformer.from_config`` (a diffusers model class) under ``component_seed(seed,
    "transformer")`` as the toy trainers do (``save_components``), saved as safetensors;
    the other components copied. Built once into ``out``; rebuilt when the trained
    weights or ``version`` change."""
    from diffserve.zoo.components import MARKER_FILE, save_components
    from diffserve.zoo.publish import build_into

    marker = json.loads((trained / MARKER_FILE).read_text(encoding="utf-8"))
    source = hashlib.sha256(
        (trained / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes()
    ).hexdigest()
    with_marker = {
        **marker,
        "kind": kind,
        "random_weights": True,
        "twin_version": version,
        "twin_of": source,
        "description": f"{marker.get('kind')} with its untrained transformer",
    }
    try:
        if json.loads((out / MARKER_FILE).read_text(encoding="utf-8")) == with_marker:
            return out
    except (OSError, ValueError):
        pass
    config = dict(transformer.load_config(str(trained / "transformer")))

    def write(staging: Path) -> None:
        for item in trained.iterdir():
            if item.name in ("transformer", MARKER_FILE, *TRAINING_FILES):
                continue
            (shutil.copytree if item.is_dir() else shutil.copy2)(
                item, staging / item.name
            )
        save_components(
            {"transformer": lambda: transformer.from_config(config)},
            staging,
            int(marker.get("seed", 0)),
        )
        (staging / MARKER_FILE).write_text(
            json.dumps(with_marker, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )

    return build_into(out, write, force=True)


def models(
    trained: Path,
    twin: Callable[[Path, Path], Path],
    twin_dir: str,
    built: Mapping[str, Path],
) -> dict[str, Path]:
    """The trained model and its random twin (``twin(trained, out)``), built beside the
    benchmark's other models (``built``: the run's built models; the default model cache
    without any)."""
    from benchmarks.models import DEFAULT_CACHE

    cache_dir = next(iter(built.values())).parent if built else DEFAULT_CACHE
    return {TRAINED: trained, RANDOM: twin(trained, cache_dir / twin_dir)}


def method_note(warmup: int, unit: str) -> str:
    """How every point is measured (the same words in both sections)."""
    over = "the pairs" if unit == "image" else "every frame of every pair"
    return (
        f"{RANDOM}: the same directory with the transformer "
        "its training started from (same config, seed and "
        "init). Cache rules: the stage defaults (first step "
        "and last step computed, no cap on consecutive skips). "
        f"Per point: median s/{unit} over the pairs (points "
        f"interleaved per pair, after {warmup} untimed 1-step "
        "warm-up); skipped steps as the mean over the pairs; "
        "PSNR over all pairs' pixels (one pooled MSE) and "
        "SSIM (11x11 Gaussian, luminance) as the mean over "
        f"{over}, against the same engine's "
        f"uncached {unit} of each pair. Signal = the median "
        "over pairs and steps of the per-step value compared "
        "with the threshold in an uncached run (untimed probe "
        f"at threshold {PROBE:g}: every step computes); "
        f"teacache's is its rescaled value, which it accumulates until a step computes."
    )


def run(
    section: Section,
    sweep: Sweep,
    paths: Mapping[str, Path],
    sweeps: Mapping[str, tuple[float, ...]],
) -> None:
    """Every model of ``paths`` with every backend that has thresholds in ``sweeps``:
    one engine each, reported."""
    section.columns = sweep.columns()
    for model, path in paths.items():
        # A backend without thresholds is not measured.
        for backend in (b for b in BACKENDS if sweeps.get(b)):
            thresholds = tuple(sorted(set(sweeps[backend])))
            points, signals = measure_engine(path, sweep, backend, thresholds)
            report(section, sweep, model, backend, points, signals)
            del points
            gc.collect()


def measure_engine(
    path: Path, sweep: Sweep, backend: str, thresholds: tuple[float, ...]
) -> tuple[list[Point], list[list[float]]]:
    """Warm up, probe every pair's signals, then time every threshold on every pair,
    interleaved."""
    cache = {
        "backend": backend,
        "threshold": sweep.defaults[backend],
        "max_threshold": max((1.0, *thresholds)),
        **sweep.cache.get(backend, {}),
    }
    engine = C.load_engine(path, DTYPE, enforce_eager=True, cache=cache)
    pairs = sweep.pairs
    try:
        for _ in range(sweep.warmup):
            engine.generate(sweep.request(pairs[0][0], pairs[0][1], 1, 0.0))
        signals = []
        for prompt, seed in pairs:
            entry = _entry(
                engine.generate(sweep.request(prompt, seed, sweep.steps, PROBE))
            )
            if entry["skipped_steps"]:
                raise AssertionError(
                    f"the probe threshold {PROBE} skipped a step: {entry}"
                )
            signals.append([float(s) for _, s, _ in entry["trace"] if s is not None])
        points = [Point(t) for t in (0.0, *thresholds)]
        for i, (prompt, seed) in enumerate(pairs):
            for point in points if i % 2 == 0 else points[::-1]:
                request = sweep.request(prompt, seed, sweep.steps, point.threshold)
                t0 = time.perf_counter()
                output = engine.generate(request)
                point.seconds.append(time.perf_counter() - t0)
                point.images.append(sweep.output(output))
                point.entries.append(
                    _entry(output) if point.threshold else {"skipped_steps": 0}
                )
    finally:
        C.shutdown(engine)
    return points, signals


def _entry(output: Any) -> dict[str, Any]:
    entries = (getattr(output, "attestation", None) or {}).get("cache")
    if not entries:
        raise Unavailable("diffserve output has no attestation['cache'] entry")
    return entries[0]


def summarise(points: list[Point], sweep: Sweep) -> list[dict[str, Any]]:
    """Per point: median s/output, speed-up, mean skipped steps, PSNR (pooled over every
    frame of every pair) and mean SSIM (over every frame) against the uncached point's
    output of the same pair (``points[0]``), and per check how many outputs pass it."""
    base = points[0]
    base_s = median(base.seconds)
    reference = [frame for output in base.images for frame in sweep.frames(output)]
    rows = []
    for point in points:
        frames = [frame for output in point.images for frame in sweep.frames(output)]
        similarity = (
            [ssim(a, b) for a, b in zip(frames, reference, strict=True)]
            if point is not base
            else [1.0]
        )
        verdicts = [
            sweep.checks(prompt, output)
            for (prompt, _), output in zip(sweep.pairs, point.images, strict=True)
        ]
        rows.append(
            {
                "threshold": point.threshold,
                "median_s": median(point.seconds),
                "spread": spread(point.seconds),
                "runs": len(point.seconds),
                "speedup": base_s / median(point.seconds),
                "skipped": statistics.fmean(e["skipped_steps"] for e in point.entries),
                "psnr_db": pooled_psnr(frames, reference),
                "ssim": statistics.fmean(similarity),
                **{name: sum(v[name] for v in verdicts) for name in sweep.labels},
                "pairs": len(sweep.pairs),
            }
        )
    return rows


def pooled_psnr(images: list[Any], references: list[Any]) -> float:
    """PSNR over the pixels of all pairs together (one pooled MSE): finite as soon as
    one image differs, where a mean of per-image PSNRs would be infinite whenever one
    image is identical."""
    import numpy as np

    return psnr(
        np.concatenate([to_array(x) for x in images]),
        np.concatenate([to_array(x) for x in references]),
    )


def report(
    section: Section,
    sweep: Sweep,
    model: str,
    backend: str,
    points: list[Point],
    signals: list[list[float]],
) -> None:
    """One row per point, its metrics, and a note with the probe's signals."""
    flat = [s for row in signals for s in row]
    signal = median(flat)
    prefix = f"{sweep.prefix}.{model}.{backend}"
    section.metrics[f"{prefix}.signal_median"] = signal
    for row in summarise(points, sweep):
        threshold = row["threshold"]
        default = " (default)" if threshold == sweep.defaults[backend] else ""
        section.add(
            model,
            backend,
            "uncached" if threshold == 0 else f"{threshold:g}{default}",
            round(signal, 3),
            f"{row['skipped']:.1f}/{sweep.steps}",
            round(row["median_s"], 3),
            f"{row['spread']:.0%}",
            row["runs"],
            f"{row['speedup']:.2f}x",
            _db(row["psnr_db"]) if threshold else "",
            f"{row['ssim']:.4f}" if threshold else "",
            *(f"{row[name]}/{row['pairs']}" for name in sweep.labels),
        )
        key = f"{prefix}.{'uncached' if threshold == 0 else f't{threshold:g}'}"
        for name in (
            "median_s",
            "speedup",
            "skipped",
            "psnr_db",
            "ssim",
            *sweep.labels,
        ):
            section.metrics[f"{key}.{name}"] = row[name]
    first = [round(s, 3) for s in signals[0][:SIGNALS_SHOWN]] if signals else []
    section.notes.append(
        f"{model} {backend}: signals "
        f"per step {min(flat, default=0):.3f}-{max(flat, default=0):.3f} "
        f"(median {signal:.3f}); first pair, steps 2-{len(first) + 1}: {first}"
    )


def _db(value: float) -> str:
    return "identical" if value == float("inf") else f"{value:.1f}"
