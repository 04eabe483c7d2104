"""(s) Mixed traffic: step-level batching beyond the peers. Requests of different
sizes, step counts, step-cache thresholds and LoRA adapters arrive together; diffserve
with ``batching: step`` runs them in one batch (each size its own group of rows, each
request its own schedule, cache slot and adapters; a cost-aware deficit-round-robin
scheduler fills the per-step token budget, ``max_step_tokens``), ``batching: request``
batches only requests with equal full batch keys, and sequential diffusers runs one
request at a time.

The mix (``mixed_load.draw_mix``, seeded): sizes, step counts, thresholds {0, x} with
the stage's fbcache on, adapters {none, A, B} (random rank-16 LoRAs, ``zoo.lora``, as
section k builds them), every field drawn independently. Two runs:

- open loop: one seeded Poisson trace (``arrivals.unit_trace``) of the mix, scaled to
  ``mixed_load`` x 1/S, S the slowest contender's mean time alone over the mix's first
  requests (as section i picks its high level); every contender gets the same trace.
  Engines ``batching: step`` and ``batching: request`` (same config otherwise) live
  together and the three contenders are interleaved round by round.
- closed loop: ``mixed_clients`` clients, each with one request outstanding (section d),
  over another draw of the mix: diffserve ``batching: step`` against sequential
  diffusers, interleaved, with no other engine alive: the open loop's step engine
  (``mixed_closed_both``), then, unless ``mixed_batch_invariant``, a step engine with
  ``batch_invariant: false`` (whole-batch kernels), the target's contender.

diffusers: real ``FluxPipeline`` calls, adapters through its own ``load_lora_weights`` /
``set_adapters`` (PEFT), uncached (plain diffusers computes every step), always on the
live engine's worker thread (one OpenMP team per process,
``contenders.on_worker_thread``).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import contenders as C
from benchmarks import mixed_load as L
from benchmarks.arrivals import unit_trace
from benchmarks.section import Section
from benchmarks.settings import SEED, Settings

DTYPE = "float32"
STEP, REQUEST, DIFFUSERS = (
    "diffserve batching=step",
    "diffserve batching=request",
    "diffusers sequential",
)
SLUG = {STEP: "step", REQUEST: "request", DIFFUSERS: "diffusers"}
RANK = 16
COLUMNS = [
    "run",
    "contender",
    "requests",
    "offered req/s",
    "p50 s",
    "p95 s",
    "max s",
    "images/s",
    "vs sequential diffusers",
    "mean running while busy",
    "steps skipped (step cache) / steps",
]


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    model = settings.mixed_model
    path = models[model]
    section.columns = list(COLUMNS)
    files = _adapters(path)
    thresholds = (0.0, settings.mixed_threshold)
    mix = L.draw_mix(
        settings.mixed_requests, settings.mixed_sizes, settings.mixed_steps, thresholds
    )
    closed = L.draw_mix(
        settings.mixed_closed_requests,
        settings.mixed_sizes,
        settings.mixed_steps,
        thresholds,
        seed=SEED + 1,
    )
    section.notes.append(
        f"{model}, {DTYPE}, diffserve eager uni AsyncEngine, max_batch_size "
        f"{settings.mixed_batch}, max_step_tokens {settings.mixed_step_tokens}, "
        "fbcache (warmup_steps 1, no skip cap); requests "
        "drawn independently: sizes "
        + "/".join(f"{s}x{s}" for s in settings.mixed_sizes)
        + ", steps "
        + "/".join(str(s) for s in settings.mixed_steps)
        + f", cache_threshold 0/{settings.mixed_threshold:g}, adapters none/A/B "
        f"(rank {RANK}, scale 1.0). Open loop: {len(mix)} requests (seeds "
        f"{L.SEED0}..{L.SEED0 + len(mix) - 1}, mix seed {SEED}); closed loop: "
        f"{len(closed)} requests (mix seed {SEED + 1}), {settings.mixed_clients} "
        f"clients; {settings.mixed_rounds} round(s) per run, contenders' order "
        "reversed every round (latencies pooled, images/s = all images / summed "
        "spans). Latency = completion - arrival (open loop) or - submission "
        "(closed loop). Mix: "
        + L.mix_summary(mix)
        + f". Load average at the section's start: {L.loadavg()}."
    )
    failed: dict[str, int] = {}
    with L.FailedBatches() as fallback:
        engines: dict[str, Any] = {}
        try:
            for name, mode in ((STEP, "step"), (REQUEST, "request")):
                engines[name] = _engine(path, mode, files, settings, True, len(mix))
            diffusers = _diffusers(engines[STEP], path, files, section)
            _open_loop(section, settings, engines, diffusers, mix)
            failed["open"] = fallback.count
            C.shutdown(engines.pop(REQUEST))  # the closed loops: one engine at a time
            if settings.mixed_closed_both or settings.mixed_batch_invariant:
                _closed_loop(section, settings, engines[STEP], True, diffusers, closed)
                failed["inv1"] = fallback.count - failed["open"]
        finally:
            for engine in engines.values():
                C.shutdown(engine)
        contender = settings.mixed_batch_invariant
        if not contender:
            fast = _engine(path, "step", files, settings, False, len(closed))
            try:
                _closed_loop(section, settings, fast, False, diffusers, closed)
                failed["inv0"] = fallback.count - sum(failed.values())
            finally:
                C.shutdown(fast)
    if fallback.count:
        section.notes.append(
            "The engine's fallback: step-level batches that failed and were rerun "
            "one request at a time (warm-up included): "
            + ", ".join(f"{k} {v}" for k, v in failed.items())
            + f"; the figures above include it. First: {fallback.first}"
        )
    section.metrics["mixed.failed_batches.open"] = failed.get("open", 0)
    section.metrics["mixed.failed_batches.closed"] = failed.get(
        f"inv{int(contender)}", 0
    )
    m = section.metrics
    key = f"mixed.closed.inv{int(contender)}"
    m["mixed.closed.vs_diffusers"] = m[f"{key}.vs_diffusers"]
    m["mixed.closed.detail"] = (
        f"batch_invariant {str(contender).lower()} (the throughput contender): "
        f"{m[f'{key}.images_per_s']:.2f} vs "
        f"{m[f'{key}.diffusers_images_per_s']:.2f} images/s"
        + (
            f"; batch_invariant true: {m['mixed.closed.inv1.vs_diffusers']:.2f}x"
            if "mixed.closed.inv1.vs_diffusers" in m and not contender
            else ""
        )
        + "; diffusers computes every step (no step cache) where diffserve skips "
        "cached steps of the requests with a threshold (skipped steps in section s)."
    )


def _open_loop(
    section: Section,
    settings: Settings,
    engines: dict[str, Any],
    diffusers: L.DiffusersMixed,
    mix: list[L.Mixed],
) -> None:
    """Both engines and diffusers on the same trace, interleaved."""
    model, n = settings.mixed_model, len(mix)
    calls: dict[str, L.Call] = {
        name: L.engine_call(engine, model) for name, engine in engines.items()
    }
    calls[DIFFUSERS] = _on_worker(engines[STEP], diffusers)
    warm = L.warmup_mix(
        settings.mixed_sizes, settings.mixed_steps, settings.mixed_threshold
    )
    L.alone_times(calls[DIFFUSERS], warm)
    for engine in engines.values():  # every shape and adapter, batched together
        asyncio.run(L.run_closed(engine, model, warm, len(warm)))
    sample = mix[: max(1, settings.mixed_service)]
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i, item in enumerate(sample):
        for name in list(calls) if i % 2 == 0 else list(reversed(calls)):
            times[name] += L.alone_times(calls[name], [item])
    service = {name: statistics.fmean(v) for name, v in times.items()}
    s = max(service.values())
    rate = settings.mixed_load / s
    arrivals = [float(t) / rate for t in unit_trace(n)]
    runs: dict[str, list[L.MixedRun]] = {name: [] for name in calls}
    for r in range(max(1, settings.mixed_rounds)):
        for name in list(calls) if r % 2 == 0 else list(reversed(calls)):
            if name == DIFFUSERS:
                runs[name].append(L.run_sequential(calls[name], mix, arrivals))
            else:
                runs[name].append(
                    asyncio.run(L.run_open(engines[name], model, mix, arrivals))
                )
    section.notes.append(
        f"Open loop: alone (mean over the mix's first {len(sample)} requests, "
        "interleaved): "
        + ", ".join(f"{k} {v:.3f} s" for k, v in service.items())
        + f"; S = {s:.3f} s (the slowest), offered load {settings.mixed_load:g}"
        f"/S = {rate:.2f} req/s. Both engines live in this run (two OpenMP teams "
        "in the process: every contender pays it alike). "
        + L.budget_line(engines[STEP])
    )
    pooled = {name: L.pool(v) for name, v in runs.items()}
    base = pooled[DIFFUSERS].images_per_s
    steps = sum(m.steps for m in mix) * max(1, settings.mixed_rounds)
    for name, run in pooled.items():
        _row(section, "open loop", name, run, rate, base, steps)
        key = f"mixed.open.{SLUG[name]}"
        section.metrics[f"{key}.p50_s"] = run.p50
        section.metrics[f"{key}.p95_s"] = run.p95
        section.metrics[f"{key}.images_per_s"] = run.images_per_s
    section.metrics["mixed.open.lambda"] = rate
    section.metrics["mixed.service_s"] = s
    p95 = {name: pooled[name].p95 for name in (STEP, REQUEST)}
    section.metrics["mixed.open.p95_ratio"] = (
        p95[STEP] / p95[REQUEST] if p95[REQUEST] > 0 else None
    )
    section.notes.append(
        "Open loop p50/p95 by size: "
        + "; ".join(f"{SLUG[name]} {L.by_size(pooled[name], mix)}" for name in calls)
        + "."
    )


def _closed_loop(
    section: Section,
    settings: Settings,
    engine: Any,
    invariant: bool,
    diffusers: L.DiffusersMixed,
    mix: list[L.Mixed],
) -> None:
    """``engine`` (alone in the process) against diffusers on its worker thread."""
    model, clients = settings.mixed_model, settings.mixed_clients
    name = f"{STEP}, batch_invariant {str(invariant).lower()}"
    one = _on_worker(engine, diffusers)
    warm = L.warmup_mix(
        settings.mixed_sizes, settings.mixed_steps, settings.mixed_threshold
    )
    asyncio.run(L.run_closed(engine, model, warm, len(warm)))
    drivers: dict[str, Callable[[], L.MixedRun]] = {
        name: lambda: asyncio.run(L.run_closed(engine, model, mix, clients)),
        DIFFUSERS: lambda: L.closed_sequential(one, mix, clients),
    }
    runs: dict[str, list[L.MixedRun]] = {k: [] for k in drivers}
    before = len(engine.stats().get("batch_sizes", []))
    for r in range(max(1, settings.mixed_rounds)):
        for key in list(drivers) if r % 2 == 0 else list(reversed(drivers)):
            runs[key].append(drivers[key]())
    sizes = engine.stats().get("batch_sizes", [])[before:]
    pooled = {k: L.pool(v) for k, v in runs.items()}
    base = pooled[DIFFUSERS].images_per_s
    run_name = f"closed loop, {clients} clients"
    steps = sum(m.steps for m in mix) * max(1, settings.mixed_rounds)
    for key, run in pooled.items():
        _row(section, run_name, key, run, None, base, steps)
    key = f"mixed.closed.inv{int(invariant)}"
    rate = pooled[name].images_per_s
    section.metrics[f"{key}.images_per_s"] = rate
    section.metrics[f"{key}.diffusers_images_per_s"] = base
    section.metrics[f"{key}.vs_diffusers"] = rate / base if base > 0 else None
    if sizes:
        keys, counts = np.unique(np.asarray(sizes), return_counts=True)
        hist = {int(k): int(c) for k, c in zip(keys, counts, strict=True)}
        section.notes.append(
            f"Closed loop, batch_invariant {str(invariant).lower()}: requests per "
            f"engine batch (stats) {L.histogram(hist)}."
        )


def _row(
    section: Section,
    run_name: str,
    name: str,
    run: L.MixedRun,
    rate: float | None,
    base: float,
    steps: int,
) -> None:
    """One contender's row; ``steps``: the denoise steps of all its requests."""
    lat = run.latencies
    running = run.mean_running
    section.add(
        run_name,
        name,
        len(lat),
        "" if rate is None else round(rate, 3),
        round(run.p50, 3),
        round(run.p95, 3),
        round(max(lat), 3),
        round(run.images_per_s, 3),
        f"{run.images_per_s / base:.2f}x" if base > 0 else "",
        "" if running is None else round(running, 2),
        f"{sum(run.skipped)}/{steps}",
    )


def _engine(
    path: Path,
    batching: str,
    files: dict[str, Path],
    settings: Settings,
    invariant: bool,
    n: int,
) -> Any:
    """An in-process AsyncEngine (uni, eager) with fbcache and the two adapters."""
    from diffserve import AsyncEngine

    return AsyncEngine(
        str(path),
        env={},
        dtype=DTYPE,
        enforce_eager=True,
        max_batch_size=settings.mixed_batch,
        max_step_tokens=settings.mixed_step_tokens,
        batching=batching,
        batch_invariant=invariant,
        max_queue=max(64, 2 * n),
        distributed_executor_backend="uni",
        cache={
            "backend": "fbcache",
            "threshold": settings.mixed_threshold,
            "max_threshold": max(1.0, settings.mixed_threshold),
            "warmup_steps": 1,
            "max_consecutive_skips": 0,
        },
        lora_modules=",".join(f"{k}={v}" for k, v in files.items()),
        max_loras=len(files),
    )


def _adapters(path: Path) -> dict[str, Path]:
    """The two adapters, built once per model (seeded: a kept file is the same one), on
    a short-lived thread so this thread runs no OpenMP team of its own."""
    from diffserve.zoo.lora import WEIGHT_NAME, build_flux_lora

    root = path.parent / f"{path.name}-mixed-loras"
    files = {name: root / name / WEIGHT_NAME for name in L.ADAPTERS}
    errors: list[BaseException] = []

    def build() -> None:
        try:
            for seed, file in enumerate(files.values()):
                if not file.is_file():
                    build_flux_lora(
                        path, file.parent, seed=11 + seed, rank=RANK, force=True
                    )
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            errors.append(exc)

    worker = threading.Thread(target=build, name="mixed-lora-build")
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
    return files


def _diffusers(
    engine: Any, path: Path, files: dict[str, Path], section: Section | None
) -> L.DiffusersMixed:
    """diffusers' pipeline with the adapters, loaded on the engine's worker thread."""
    pipe = C.diffusers_on_worker(engine, path, DTYPE)
    mixed = C.on_worker_thread(engine, lambda: L.DiffusersMixed(pipe, files))
    if section is not None:
        section.notes.append(
            "diffusers: "
            + (
                "adapters through load_lora_weights + set_adapters/disable_lora "
                "(switched when the next request's differs)"
                if mixed.with_adapters
                else "WITHOUT adapters (load_lora_weights failed: "
                f"{mixed.adapters_error})"
            )
            + "; no step cache (every step computed, whatever the threshold)."
        )
    return mixed


def _on_worker(engine: Any, call: L.Call) -> L.Call:
    return lambda item, seed: C.on_worker_thread(engine, lambda: call(item, seed))
