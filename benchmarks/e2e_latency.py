"""(a) End-to-end latency per image: diffserve Engine (uni) vs diffusers.FluxPipeline,
same directory, prompt, seed and max_sequence_length, per model/size/steps and dtype.
Also the PSNR between the two engines' images, because a speed-up that changes the
picture is not a speed-up. diffusers runs on the engine's worker thread (both contenders
on one OpenMP team, as each runs alone; contenders.py)."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, psnr, spread
from benchmarks.section import Section
from benchmarks.settings import Case, Settings

WARMUP_SIZE = 128


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    section.columns = [
        "case",
        "dtype",
        "contender",
        "median s/image",
        "spread ±",
        "runs",
        "ratio vs diffusers",
        "PSNR vs diffusers (dB)",
        "load + warm-up (128², 1 step) s",
    ]
    # The dtype a deployment gets when it names none (issue 15's platform default:
    # bfloat16 where the CPU multiplies it natively, float32 elsewhere); the
    # default-dtype target reads this case.
    from diffserve.config.platform import native_bfloat16

    native, reason = native_bfloat16()
    section.metrics["e2e.default_dtype"] = "bfloat16" if native else "float32"
    section.notes.append(
        f"this machine's default dtype: {section.metrics['e2e.default_dtype']} "
        f"({reason})"
    )
    for case in settings.e2e_cases:
        for dtype in settings.dtypes:
            _one_case(section, settings, models[case.model], case, dtype)


def _one_case(
    section: Section, settings: Settings, path: Path, case: Any, dtype: str
) -> None:
    """One engine variant at a time (eager, then compile), each interleaved with
    diffusers run on that engine's worker thread (``contenders.on_worker_thread``: one
    OpenMP team for both, as each has alone)."""
    key = f"e2e.{case.model}.{case.size}.{case.steps}.{dtype}"
    variants = [("diffserve eager", True)]
    if case.model in settings.compile_models:
        variants.append(("diffserve compile", False))
    for name, eager in variants:
        t0 = time.perf_counter()
        try:
            engine = C.load_engine(path, dtype, enforce_eager=eager)
        except Exception as exc:  # noqa: BLE001 - the other variants still get measured
            section.add(
                case.label,
                dtype,
                name,
                "unavailable",
                "",
                0,
                "",
                "",
                f"{type(exc).__name__}: {exc}",
            )
            if name == "diffserve eager":
                raise
            continue
        try:
            load_s = {name: time.perf_counter() - t0}
            t0 = time.perf_counter()
            pipe = C.diffusers_on_worker(engine, path, dtype)
            load_s["diffusers"] = time.perf_counter() - t0
            _pair(section, settings, case, dtype, key, name, engine, pipe, load_s)
            del pipe
        finally:
            C.shutdown(engine)
        gc.collect()


def _pair(
    section: Section,
    settings: Settings,
    case: Any,
    dtype: str,
    key: str,
    name: str,
    engine: Any,
    pipe: Any,
    load_s: dict[str, float],
) -> None:
    calls: dict[str, Any] = {
        "diffusers": C.diffusers_call_on_worker(engine, pipe, case),
        name: C.engine_call(engine, case),
    }
    # Untimed warm-up of each contender on a cheap request of the same model (compile
    # happens here; blocks are compiled with dynamic shapes): a full-size warm-up of a
    # bfloat16 case costs minutes on CPUs without bf16 units. Any leftover first-call
    # cost lands in one of >= 3 timed rounds, which the median discards.
    warm_case = Case(case.model, WARMUP_SIZE, 1)
    warm_calls = {
        "diffusers": C.diffusers_call_on_worker(engine, pipe, warm_case),
        name: C.engine_call(engine, warm_case),
    }
    warm: dict[str, float] = {}
    for contender, call in warm_calls.items():
        t0 = time.perf_counter()
        for _ in range(settings.warmup):
            call()
        warm[contender] = time.perf_counter() - t0
    samples, last = interleaved(
        calls, warmup=0, iters=settings.iters, budget_s=settings.case_budget_s
    )
    base = median(samples["diffusers"])
    print(
        f"[bench]   {case.label} {dtype}: "
        + ", ".join(f"{n} {median(t):.3f}s" for n, t in samples.items()),
        flush=True,
    )
    mode = name.removeprefix("diffserve ")
    for contender, times in samples.items():
        m = median(times)
        ratio = m / base if contender != "diffusers" else 1.0
        quality = (
            psnr(last[contender][0], last["diffusers"][0])
            if contender != "diffusers"
            else None
        )
        label = contender if contender != "diffusers" else f"diffusers (beside {mode})"
        section.add(
            case.label,
            dtype,
            label,
            round(m, 4),
            f"{spread(times):.0%}",
            len(times),
            round(ratio, 3),
            _db(quality),
            round(load_s[contender] + warm[contender], 1),
        )
        slug = contender.replace(" ", "_") + (
            "" if contender != "diffusers" else "_" + mode
        )
        section.metrics[f"{key}.{slug}.median_s"] = m
    section.metrics[f"{key}.{mode}.ratio"] = median(samples[name]) / base
    section.metrics[f"{key}.{mode}.psnr_db"] = psnr(last[name][0], last["diffusers"][0])
    phases = ", ".join(
        f"{k} {v:.0f}" for k, v in getattr(calls[name], "timings", {}).items()
    )
    if phases:
        section.notes.append(
            f"{case.label} {dtype} {name}: last call's phases (ms): {phases}"
        )


def _db(value: float | None) -> Any:
    if value is None:
        return ""
    return "identical" if value == float("inf") else round(value, 1)
