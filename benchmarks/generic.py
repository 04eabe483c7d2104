"""(j) The generic path: diffserve's Engine serving diffusers' StableDiffusion3Pipeline
(its denoiser on our kernels) against the same pipeline called directly, on the very
same directory, prompt and seed, per model and dtype. SD3 runs CFG at its default
guidance 7.0 on both sides (one batched forward of two rows per step). Also the PSNR
between the two images: the same ops run, so float32 should match."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from benchmarks.common import interleaved, median, psnr, spread
from benchmarks.contenders import shutdown, torch_dtype
from benchmarks.section import Section
from benchmarks.settings import MAX_SEQUENCE_LENGTH, PROMPT, SEED, Case, Settings

GUIDANCE = 7.0  # SD3's pipeline default


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
        "load + warm-up s",
    ]
    for case in settings.generic_cases:
        path = _ensure(case.model, models)
        for dtype in settings.dtypes:
            _one_case(section, settings, path, case, dtype)


def _ensure(kind: str, models: dict[str, Path]) -> Path:
    """Generic models are built beside the FLUX ones (same cache directory, same
    deterministic builder)."""
    from diffserve.zoo.components import MARKER_FILE
    from diffserve.zoo.generic import build_generic_model

    root = next(iter(models.values())).parent
    out = root / kind
    if not (out / MARKER_FILE).is_file():
        build_generic_model(kind, out, seed=0, force=out.exists())
    return out


def _one_case(
    section: Section, settings: Settings, path: Path, case: Case, dtype: str
) -> None:
    import diffusers
    import torch

    from diffserve import Engine, GenerationRequest
    from diffserve.models.generic.build import ensure_dtype

    key = f"generic.{case.model}.{case.size}.{case.steps}.{dtype}"
    start = time.perf_counter()
    pipe = diffusers.StableDiffusion3Pipeline.from_pretrained(
        str(path), torch_dtype=torch_dtype(dtype)
    )
    pipe.set_progress_bar_config(disable=True)
    # As our loader does (diffusers leaves SD3 in fp32)
    ensure_dtype(pipe.transformer, torch_dtype(dtype))
    load = {"diffusers": time.perf_counter() - start}
    start = time.perf_counter()
    engine = Engine(
        str(path), dtype=dtype, enforce_eager=True, distributed_executor_backend="uni"
    )
    load["diffserve eager"] = time.perf_counter() - start

    def diffusers_call(size: int = case.size, steps: int = case.steps) -> Any:
        with torch.inference_mode():
            return pipe(
                prompt=PROMPT,
                height=size,
                width=size,
                num_inference_steps=steps,
                guidance_scale=GUIDANCE,
                generator=torch.Generator().manual_seed(SEED),
                max_sequence_length=MAX_SEQUENCE_LENGTH,
            ).images

    def engine_call(size: int = case.size, steps: int = case.steps) -> Any:
        return engine.generate(
            GenerationRequest(
                prompt=PROMPT,
                height=size,
                width=size,
                num_inference_steps=steps,
                guidance_scale=GUIDANCE,
                seed=SEED,
                max_sequence_length=MAX_SEQUENCE_LENGTH,
            )
        ).images

    try:
        calls = {"diffusers": diffusers_call, "diffserve eager": engine_call}
        for name, call in calls.items():  # untimed warm-up on a cheap request
            start = time.perf_counter()
            call(64, 1)
            load[name] += time.perf_counter() - start
        samples, last = interleaved(
            calls, warmup=0, iters=settings.iters, budget_s=settings.case_budget_s
        )
    finally:
        shutdown(engine)
    base = median(samples["diffusers"])
    print(
        f"[bench]   {case.label} {dtype}: "
        + ", ".join(f"{n} {median(t):.3f}s" for n, t in samples.items()),
        flush=True,
    )
    for name, times in samples.items():
        ratio = median(times) / base
        quality = (
            psnr(last[name][0], last["diffusers"][0]) if name != "diffusers" else None
        )
        section.add(
            case.label,
            dtype,
            name,
            round(median(times), 4),
            f"{spread(times):.0%}",
            len(times),
            round(ratio, 3),
            ""
            if quality is None
            else ("identical" if quality == float("inf") else round(quality, 1)),
            round(load[name], 1),
        )
        if name != "diffusers":
            section.metrics[f"{key}.ratio"] = ratio
            section.metrics[f"{key}.psnr_db"] = quality
    del samples, last
    gc.collect()
