"""(h) Step cache side by side with cache-dit: diffserve's First-Block Cache against
diffusers' FluxPipeline with cache-dit's DBCache F1B0 (one front compute block, no back
blocks: the same First-Block-Cache rule), on the same weights and the same request.

Both engines compare block 0's residual with the one of the last computed step (relative
mean absolute difference) and skip the rest of the transformer while it stays below the
threshold; both compute the first ``WARMUP_STEPS`` steps and have no cap on consecutive
skips. For every threshold (and uncached) each engine's wall time per image is the
median over interleaved calls (contenders A B ... then ... B A); speed-up, PSNR and SSIM
are against the same engine's own uncached image (same seed), and the skipped steps come
from the engine itself: diffserve's ``attestation["cache"]``, cache-dit's ``summary()``.

diffserve runs every point on one Engine (``cache.backend: fbcache``) with a per-request
``cache_threshold`` (0 = uncached). cache-dit patches ``FluxPipeline.__call__`` at class
level and the transformer's forward for good, so it gets its own pipeline, and is
enabled before and disabled after each of its calls (outside the timed region); the
uncached diffusers baseline is a separate, never patched pipeline. A missing cache-dit
(the ``bench`` extra) leaves the diffserve rows and says why.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import median, psnr, spread, ssim
from benchmarks.section import Section, Unavailable
from benchmarks.settings import (
    GUIDANCE_SCALE,
    MAX_SEQUENCE_LENGTH,
    PROMPT,
    SEED,
    Case,
    Settings,
)

DTYPE = "float32"
BACKEND = "fbcache"
# Steps computed before anything may be skipped: diffserve ``cache.warmup_steps`` (its
# minimum and default) = cache-dit ``max_warmup_steps`` (its default is 8, which would
# hide most of a sweep).
WARMUP_STEPS = 1
WARMUP_SIZE = 128  # cheap untimed warm-up request per engine (as in section a)
DIFFSERVE, CACHE_DIT = "diffserve", "diffusers+cache-dit"
# first per-step signals (from step 1) shown in the notes, to check both see the same
SIGNALS_SHOWN = 6


@dataclass
class Point:
    """One (engine, threshold) contender. Only ``call`` is timed; ``before``/``after``
    are not."""

    engine: str
    threshold: float  # 0 = uncached
    call: Callable[[], Any]
    before: Callable[[], None] = lambda: None
    # -> skipped steps (None = unknown)
    after: Callable[[Any], int | None] = lambda result: None
    # Untimed cheap warm-up of this point's engine/pipeline.
    warm: Callable[[], Any] | None = None
    seconds: list[float] = field(default_factory=list)
    image: Any = None
    skipped: int | None = None
    detail: str = ""


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.cache_case
    path = models[case.model]
    thresholds = tuple(settings.cache_thresholds)
    section.notes.append(
        f"{case.label}, {DTYPE}, eager, one request at a time; "
        f"median of up to {settings.iters} interleaved "
        f"calls after {settings.warmup} untimed {WARMUP_SIZE}x{WARMUP_SIZE}/1-step "
        "warm-up per engine. "
        "Rule on both sides: First-Block Cache (block 0's residual "
        "vs the last computed step's, relative "
        "mean absolute difference; skip the other blocks while "
        f"below the threshold), first {WARMUP_STEPS} "
        "step(s) always computed, no cap on consecutive skips. "
        "diffserve: one Engine, cache.backend "
        f"{BACKEND}, per-request cache_threshold (0 = uncached). "
        "diffusers: FluxPipeline uncached, and "
        "cache-dit DBCache F1B0 (Fn_compute_blocks=1, Bn_compute_blocks=0, "
        f"max_warmup_steps={WARMUP_STEPS}) "
        "on a second FluxPipeline. One difference in the rule: "
        "diffserve always computes the last step, "
        "cache-dit may skip it, so at one threshold diffserve "
        "can skip a step fewer. Speed-up, PSNR and SSIM "
        "(11x11 Gaussian, luminance) are against the engine's "
        "own uncached image (same seed); the targets "
        "compare the engines at equal PSNR (our speed-up interpolated "
        "on our own PSNR curve at each "
        f"cache-dit point's PSNR), not at equal threshold."
    )
    section.columns = [
        "engine",
        "threshold",
        "median s/image",
        "spread ±",
        "runs",
        "speed-up vs own uncached",
        "skipped steps",
        "PSNR vs own uncached (dB)",
        "SSIM vs own uncached",
        "latency / diffusers+cache-dit's (same threshold)",
    ]
    points: list[Point] = []
    cleanup: list[Callable[[], None]] = []
    missing: dict[str, str] = {}
    try:
        try:
            points += _diffserve_points(path, case, thresholds, cleanup)
        except (ImportError, Unavailable) as exc:
            missing[DIFFSERVE] = _reason(exc)
        try:
            points += _cache_dit_points(path, case, thresholds, cleanup)
        except (ImportError, Unavailable) as exc:
            missing[CACHE_DIT] = _reason(exc)
        if not points:
            raise Unavailable("; ".join(f"{k}: {v}" for k, v in missing.items()))
        _warm_up(points, settings)
        _run(points, warmup=0, iters=settings.iters, budget_s=settings.case_budget_s)
    finally:
        for fn in reversed(cleanup):
            with contextlib.suppress(Exception):
                fn()
    _report(section, points, case, thresholds, missing)
    del points
    gc.collect()
    if DIFFSERVE in missing:
        # The cache-dit rows stay; the section says what diffserve lacks.
        raise Unavailable(f"diffserve step cache: {missing[DIFFSERVE]}")


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"


# -- contenders
# ------------------------------------------------------------------------------------


def _request(case: Case, threshold: float | None) -> Any:
    from diffserve import GenerationRequest

    return GenerationRequest(
        prompt=PROMPT,
        height=case.size,
        width=case.size,
        num_inference_steps=case.steps,
        guidance_scale=GUIDANCE_SCALE,
        seed=SEED,
        n=1,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
        cache_threshold=threshold,
    )


def _diffserve_points(
    path: Path,
    case: Case,
    thresholds: tuple[float, ...],
    cleanup: list[Callable[[], None]],
) -> list[Point]:
    engine = C.load_engine(
        path,
        DTYPE,
        enforce_eager=True,
        cache={
            "backend": BACKEND,
            "threshold": max(thresholds),
            "max_threshold": max(1.0, max(thresholds)),
            "warmup_steps": WARMUP_STEPS,
            "max_consecutive_skips": 0,
        },
    )
    cleanup.append(lambda: C.shutdown(engine))
    out: list[Point] = []
    for threshold in (0.0, *thresholds):

        def call(threshold: float = threshold) -> Any:
            return engine.generate(_request(case, threshold))

        def after(
            output: Any, threshold: float = threshold, point_index: int = len(out)
        ) -> int | None:
            entry = _cache_entry(output)
            point = out[point_index]
            if entry is None:
                if threshold == 0:
                    return 0
                raise Unavailable("diffserve output has no attestation['cache'] entry")
            computed, skipped = entry.get("computed_steps"), entry.get("skipped_steps")
            if (
                computed is not None
                and skipped is not None
                and computed + skipped != case.steps
            ):
                raise AssertionError(
                    f"diffserve attestation: computed {computed} + skipped {skipped} "
                    f"!= {case.steps} steps"
                )
            point.detail = _steps_of(entry)
            return int(skipped) if skipped is not None else None

        out.append(Point(DIFFSERVE, threshold, call, after=after))
    out[0].warm = lambda: engine.generate(
        _request(Case(case.model, WARMUP_SIZE, 1), 0.0)
    )
    return out


def _cache_entry(output: Any) -> dict[str, Any] | None:
    entries = (getattr(output, "attestation", None) or {}).get("cache")
    if isinstance(entries, list) and entries:
        return entries[0]
    return entries if isinstance(entries, dict) else None


def _steps_of(entry: dict[str, Any]) -> str:
    """Skipped steps (0-based, as cache-dit counts them: the trace counts from 1) and
    the first signals."""
    trace = entry.get("trace") or []
    skipped = [int(s) - 1 for s, *rest in trace if rest and rest[-1] == "skip"]
    signals = [round(float(sig), 3) for _, sig, *_ in trace if sig is not None][
        :SIGNALS_SHOWN
    ]
    return f"skipped {skipped}, signals {signals}"


def _first_image(result: Any) -> Any:
    images = getattr(result, "images", result)
    return images[0]


def _cache_dit_points(
    path: Path,
    case: Case,
    thresholds: tuple[float, ...],
    cleanup: list[Callable[[], None]],
) -> list[Point]:
    # Before cache_dit's logger is created: its info lines on every enable/disable would
    # flood the log.
    os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "error")
    try:
        import cache_dit
        from cache_dit import DBCacheConfig
    except Exception as exc:  # noqa: BLE001 - not installed, or it fails to import next to this torch
        raise Unavailable(
            f"cache-dit does not import: {type(exc).__name__}: {exc} "
            "(pip install -e '.[bench]')"
        ) from exc
    plain = C.load_diffusers(path, DTYPE)
    cached = C.load_diffusers(path, DTYPE)
    cleanup.append(
        lambda: (
            cache_dit.disable_cache(cached)
            if hasattr(cached, "_context_manager")
            else None
        )
    )

    cached_call = C.diffusers_call(cached, case)
    out = [Point(CACHE_DIT, 0.0, C.diffusers_call(plain, case), after=lambda result: 0)]
    for threshold in thresholds:
        config = DBCacheConfig(
            Fn_compute_blocks=1,
            Bn_compute_blocks=0,
            residual_diff_threshold=threshold,
            max_warmup_steps=WARMUP_STEPS,
            warmup_interval=1,
            max_cached_steps=-1,
            max_continuous_cached_steps=-1,
            enable_separate_cfg=False,
        )

        def before(config: Any = config) -> None:
            cache_dit.enable_cache(cached, cache_config=config)

        def after(result: Any, point_index: int = len(out)) -> int | None:
            try:
                stats = [
                    s
                    for s in cache_dit.summary(cached, logging=False)
                    if s.cache_options
                ]
                steps = sorted({int(s) for st in stats for s in st.cached_steps})
                diffs = next(
                    (st.residual_diffs for st in stats if st.residual_diffs), {}
                )
            finally:
                cache_dit.disable_cache(cached)
            signals = [
                round(float(v), 3)
                for _, v in sorted(diffs.items(), key=lambda kv: _step_key(kv[0]))
            ]
            out[
                point_index
            ].detail = f"skipped {steps}, signals {signals[:SIGNALS_SHOWN]}"
            return len(steps)

        out.append(Point(CACHE_DIT, threshold, cached_call, before=before, after=after))
    out[0].warm = C.diffusers_call(plain, Case(case.model, WARMUP_SIZE, 1))
    # The cache-dit pipeline's own first call, through its patched path.
    if len(out) > 1:
        first, warm_cached = (
            out[1],
            C.diffusers_call(cached, Case(case.model, WARMUP_SIZE, 1)),
        )

        def warm() -> None:
            first.before()
            try:
                warm_cached()
            finally:
                first.after(None)

        first.warm = warm
    return out


def _step_key(key: Any) -> tuple[int, str]:
    """cache-dit keys its per-step diffs by the step as a string ('1', '2', ...)."""
    text = str(key)
    return (int(text), text) if text.isdigit() else (1 << 30, text)


# -- timing
# --------------------------------------------------------------------------------------


def _warm_up(points: list[Point], settings: Settings) -> None:
    for _ in range(settings.warmup):
        for point in points:
            if point.warm is not None:
                point.warm()


def _run(
    points: list[Point],
    *,
    warmup: int,
    iters: int,
    budget_s: float | None,
    min_iters: int = 3,
) -> None:
    """``common.interleaved`` with an untimed ``before``/``after`` around each timed
    call (cache-dit is enabled and disabled there), keeping each point's last image and
    skipped steps."""
    for _ in range(warmup):
        for point in points:
            _one(point, record=False)
    rounds, i = iters, 0
    while i < rounds:
        for point in points if i % 2 == 0 else points[::-1]:
            _one(point, record=True)
        if i == 0 and budget_s is not None:
            per_round = sum(p.seconds[0] for p in points)
            rounds = max(
                min(min_iters, iters), min(iters, int(budget_s // max(per_round, 1e-9)))
            )
        i += 1


def _one(point: Point, *, record: bool) -> None:
    point.before()
    try:
        t0 = time.perf_counter()
        result = point.call()
        seconds = time.perf_counter() - t0
    except BaseException:
        with contextlib.suppress(Exception):
            point.after(None)
        raise
    skipped = point.after(result)
    if record:
        point.seconds.append(seconds)
    point.image = _first_image(result)
    point.skipped = skipped


# -- report
# --------------------------------------------------------------------------------------


def _report(
    section: Section,
    points: list[Point],
    case: Case,
    thresholds: tuple[float, ...],
    missing: dict[str, str],
) -> None:
    by = {(p.engine, p.threshold): p for p in points}
    summary: dict[str, list[dict[str, Any]]] = {}
    for engine in (DIFFSERVE, CACHE_DIT):
        base = by.get((engine, 0.0))
        if base is None:
            section.add(
                engine,
                "",
                "not available",
                "",
                0,
                "",
                "",
                "",
                "",
                missing.get(engine, ""),
            )
            continue
        base_s = median(base.seconds)
        rows = summary.setdefault(engine, [])
        for threshold in (0.0, *thresholds):
            p = by[(engine, threshold)]
            m = median(p.seconds)
            quality = psnr(p.image, base.image) if threshold else float("inf")
            similarity = ssim(p.image, base.image) if threshold else 1.0
            other = by.get((CACHE_DIT, threshold)) if engine == DIFFSERVE else None
            vs = (
                f"{m / median(other.seconds):.2f}"
                if other is not None and other.seconds
                else ""
            )
            section.add(
                engine,
                threshold if threshold else "uncached",
                round(m, 3),
                f"{spread(p.seconds):.0%}",
                len(p.seconds),
                f"{base_s / m:.2f}x",
                "" if p.skipped is None else f"{p.skipped}/{case.steps}",
                "identical" if quality == float("inf") else round(quality, 1),
                round(similarity, 4),
                vs,
            )
            rows.append(
                {
                    "threshold": threshold,
                    "median_s": m,
                    "speedup": base_s / m,
                    "skipped": p.skipped,
                    "steps": case.steps,
                    "psnr_db": quality,
                    "ssim": similarity,
                }
            )
            point = "uncached" if threshold == 0 else f"t{threshold:g}"
            key = f"cache.{_slug(engine)}.{point}"
            section.metrics[f"{key}.median_s"] = m
            section.metrics[f"{key}.speedup"] = base_s / m
            section.metrics[f"{key}.skipped"] = p.skipped
            section.metrics[f"{key}.psnr_db"] = quality
            section.metrics[f"{key}.ssim"] = similarity
    for threshold in thresholds:
        details = [
            f"{engine} {by[(engine, threshold)].detail}"
            for engine in (DIFFSERVE, CACHE_DIT)
            if (engine, threshold) in by and by[(engine, threshold)].detail
        ]
        if details:
            section.notes.append(
                f"threshold {threshold} (steps counted from 0): " + "; ".join(details)
            )
    section.metrics["cache.case"] = case.label
    section.metrics["cache.points"] = summary
    if DIFFSERVE in summary and CACHE_DIT in summary:
        _compare(section, summary[DIFFSERVE], summary[CACHE_DIT])
    for engine, reason in missing.items():
        section.notes.append(f"{engine}: not available: {reason}")


def _compare(
    section: Section, ours: list[dict[str, Any]], theirs: list[dict[str, Any]]
) -> None:
    """The two targets' inputs. (1) For every cache-dit threshold that skipped a step:
    our speed-up at its PSNR (``_speedup_at``: interpolated on our own speed-up/PSNR
    curve, uncached point included), over its speed-up. (2) Our latency over
    cache-dit's, uncached and at every threshold."""
    ratios: list[tuple[float, str]] = []
    for point in theirs:
        if not point["threshold"] or not point["skipped"]:
            continue
        speedup, how = _speedup_at(ours, point["psnr_db"])
        ratios.append(
            (
                speedup / point["speedup"],
                f"cache-dit {point['threshold']:g}: {point['speedup']:.2f}x "
                f"at {_db(point['psnr_db'])} vs "
                f"ours {speedup:.2f}x ({how})",
            )
        )
    if ratios:
        worst = min(ratios, key=lambda r: r[0])
        section.metrics["cache.equal_psnr.min_ratio"] = worst[0]
        section.metrics["cache.equal_psnr.detail"] = "; ".join(
            text for _, text in ratios
        )
    else:
        section.metrics["cache.equal_psnr.detail"] = (
            "cache-dit skipped no step at any threshold"
        )
    latency = [
        (
            o["median_s"] / t["median_s"],
            "uncached" if o["threshold"] == 0 else f"{o['threshold']:g}",
        )
        for o, t in zip(ours, theirs, strict=True)
        if o["threshold"] == t["threshold"]
    ]
    if latency:
        section.metrics["cache.latency.max_ratio"] = max(r for r, _ in latency)
        section.metrics["cache.latency.detail"] = ", ".join(
            f"{label} {r:.2f}" for r, label in latency
        )


def _speedup_at(ours: list[dict[str, Any]], psnr_db: float) -> tuple[float, str]:
    """Our speed-up at ``psnr_db``: linear between our two points whose PSNRs bracket it
    (an identical, uncached point counts as 99 dB); below our lowest PSNR, our fastest
    point (no extrapolation)."""
    curve = sorted(
        (min(p["psnr_db"], 99.0), p["speedup"], p["threshold"]) for p in ours
    )
    if psnr_db <= curve[0][0]:
        low = curve[0]
        return low[1], f"threshold {low[2]:g} at {_db(low[0])}, our lowest PSNR"
    for (p0, s0, t0), (p1, s1, t1) in zip(curve, curve[1:], strict=False):
        if p0 <= psnr_db <= p1:
            w = 0.0 if p1 == p0 else (psnr_db - p0) / (p1 - p0)
            return (
                s0 + w * (s1 - s0),
                f"interpolated between thresholds {t0:g} ({_db(p0)}) "
                f"and {t1:g} ({_db(p1)})",
            )
    top = curve[-1]
    return top[1], f"threshold {top[2]:g}"


def _slug(engine: str) -> str:
    return "diffserve" if engine == DIFFSERVE else "cachedit"


def _db(value: float) -> str:
    return "identical" if value == float("inf") else f"{value:.1f} dB"
