"""(g) Parallel denoising: CFG-parallel and Ulysses sequence parallelism on the mp
executor.

One request at a time, interleaved: a true-CFG request (negative prompt,
``true_cfg_scale`` 4.0, ``guidance_scale`` 0 for the schnell-like benchmark models) on
``cfg_parallel_size: 2`` with 1 torch thread per rank, against the same request on 1
rank with 2 threads; and a plain request on ``ulysses_degree: 2`` x 1 thread against the
same 1 rank x 2 threads. Worker threads are set through ``OMP_NUM_THREADS`` while the
engine starts (as in ``replicas.py``). PSNR compares the parallel image with the
single-rank one (float32 on CPU: expected identical).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, psnr, spread
from benchmarks.replicas import _worker_threads
from benchmarks.section import Section, Unavailable
from benchmarks.settings import MAX_SEQUENCE_LENGTH, PROMPT, SEED, Case, Settings

DTYPE = "float32"
NEGATIVE_PROMPT = "blurry, dark, low quality"
TRUE_CFG_SCALE = 4.0
ULYSSES = 2
SINGLE = "1 rank x 2 threads (mp)"


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.overhead_case
    path = models[case.model]
    if case.size % (16 * ULYSSES):
        raise Unavailable(
            f"{case.label}: Ulysses={ULYSSES} needs sizes that are "
            f"multiples of {16 * ULYSSES}"
        )
    section.notes.append(
        f"{case.label}, {DTYPE}, eager, one request at a time; "
        f"median of up to {settings.iters} "
        f"interleaved calls after {settings.warmup} warm-up. "
        "True-CFG request: negative prompt "
        f"{NEGATIVE_PROMPT!r}, true_cfg_scale {TRUE_CFG_SCALE}, guidance_scale 0."
    )
    section.columns = [
        "request",
        "contender",
        "median s/image",
        "spread ±",
        "vs 1 rank x 2 threads",
        "PSNR vs 1 rank (dB)",
    ]
    engines: dict[str, Any] = {}
    try:
        with _worker_threads(2):
            engines[SINGLE] = C.load_engine(
                path, DTYPE, distributed_executor_backend="mp"
            )
        with _worker_threads(1):
            engines["CFG=2 x 1 thread (mp)"] = C.load_engine(
                path, DTYPE, distributed_executor_backend="mp", cfg_parallel_size=2
            )
        # smoke: one parallel layout runs the harness (two more workers cost the suite)
        if not settings.smoke:
            with _worker_threads(1):
                engines[f"Ulysses={ULYSSES} x 1 thread (mp)"] = C.load_engine(
                    path,
                    DTYPE,
                    distributed_executor_backend="mp",
                    ulysses_degree=ULYSSES,
                )
        _compare(
            section,
            settings,
            "true CFG",
            "cfg",
            engines[SINGLE],
            "CFG=2 x 1 thread (mp)",
            engines["CFG=2 x 1 thread (mp)"],
            lambda: _request(case, cfg=True),
        )
        if not settings.smoke:
            _compare(
                section,
                settings,
                "plain",
                "ulysses",
                engines[SINGLE],
                f"Ulysses={ULYSSES} x 1 thread (mp)",
                engines[f"Ulysses={ULYSSES} x 1 thread (mp)"],
                lambda: _request(case, cfg=False),
            )
    finally:
        for engine in engines.values():
            C.shutdown(engine)
    section.notes.append(
        "On this CPU machine both layouts share the same 2 "
        "cores as the single rank: splitting the work over "
        "2 ranks x 1 thread instead of 1 rank x 2 threads trades "
        "intra-op threading for process parallelism "
        "plus a gloo collective per step (CFG) or two all_to_all "
        "per attention (Ulysses), so the win is "
        "small or negative here. The point of parallel denoising "
        "is accelerators, where each rank brings "
        "its own device; these rows check that the layouts "
        "run and give the single-rank image, not a speed-up. "
        "Other load on the machine hurts the 2-thread rank "
        "most (one descheduled thread stalls every parallel "
        "region), so a large parallel 'win' here means a busy "
        "machine, not parallel denoising: see the load below."
    )
    section.notes.append(
        f"load average (1, 5, 15 min) at the end of this section: {_load()}"
    )


def _load() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _request(case: Case, *, cfg: bool) -> Any:
    from diffserve import GenerationRequest

    extra: dict[str, Any] = (
        {
            "negative_prompt": NEGATIVE_PROMPT,
            "true_cfg_scale": TRUE_CFG_SCALE,
            "guidance_scale": 0.0,
        }
        if cfg
        else {}
    )
    return GenerationRequest(
        prompt=PROMPT,
        height=case.size,
        width=case.size,
        num_inference_steps=case.steps,
        seed=SEED,
        n=1,
        max_sequence_length=MAX_SEQUENCE_LENGTH,
        **extra,
    )


def _compare(
    section: Section,
    settings: Settings,
    label: str,
    key: str,
    single: Any,
    name: str,
    parallel: Any,
    make_request: Callable[[], Any],
) -> None:
    outputs: dict[str, Any] = {}

    def call(engine: Any, which: str) -> Callable[[], Any]:
        def run() -> Any:
            outputs[which] = engine.generate(make_request())
            return outputs[which]

        return run

    calls = {SINGLE: call(single, SINGLE), name: call(parallel, name)}
    samples, _ = interleaved(
        calls,
        warmup=settings.warmup,
        iters=settings.iters,
        budget_s=settings.case_budget_s,
    )
    base = median(samples[SINGLE])
    quality = psnr(outputs[name].images[0], outputs[SINGLE].images[0])
    for who in (SINGLE, name):
        ratio = median(samples[who]) / base
        section.add(
            label,
            who,
            round(median(samples[who]), 3),
            f"{spread(samples[who]):.0%}",
            f"{ratio:.2f}x",
            "reference"
            if who == SINGLE
            else ("identical" if quality == float("inf") else round(quality, 1)),
        )
    section.metrics[f"parallel.{key}.single_s"] = base
    section.metrics[f"parallel.{key}.parallel_s"] = median(samples[name])
    section.metrics[f"parallel.{key}.speedup"] = base / median(samples[name])
    section.metrics[f"parallel.{key}.psnr_db"] = quality
    att = outputs[name].attestation
    section.notes.append(
        f"{label} on {name}: attestation parallel={att.get('parallel')}, "
        "transformer forwards per "
        f"rank {[r.get('transformer_forwards') for r in att.get('per_rank', [])]}, "
        "collectives "
        f"{ {k: v.get('calls') for k, v in (att.get('collectives') or {}).items()} }"
    )
