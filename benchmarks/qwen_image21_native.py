"""(t) Qwen-Image-2.1: would a native path pay? The generic path (diffusers'
QwenImage21Pipeline, its denoiser on our kernels) against the same pipeline called
directly on the same directory, prompt and seed; then where a generic request's time
goes, from torch's profiler over one request on the engine's own pipeline: the
denoiser's GEMMs and attention (what a native runner would still run, on the same
kernels), the rest of the denoiser's ops (norms, RoPE, modulation, reshapes, the prefix
KV cache's copies: what a native runner could fuse away) and everything outside the
denoiser (text encoder, VAE, scheduler, Python).

The bound: if a native runner removed all of the denoiser's non-GEMM, non-attention
work, a request would take ``1 - other_share`` of its time, a speed-up of at most
``1 / (1 - other_share)``. Native FLUX measured 1.31-1.64x over diffusers; a family
whose bound is below 1.3x does not get a native path (docs/models.md)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import interleaved, median, psnr, spread
from benchmarks.contenders import shutdown, torch_dtype
from benchmarks.section import Section
from benchmarks.settings import PROMPT, SEED, Case, Settings

# A native runner's threshold: what native FLUX measured over diffusers (low end).
PAYS_AT = 1.3
# The ops of the denoiser a native runner runs too (on the same kernels).
KERNEL_OPS = ("addmm", "mm", "bmm", "linear", "matmul", "scaled_dot_product", "mkldnn")


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
    ]
    case = settings.qwen21_case
    path = _ensure(case.model, models)
    for dtype in settings.dtypes:
        _timed(section, settings, path, case, dtype)
        _profiled(section, path, case, dtype)


def _ensure(kind: str, models: dict[str, Path]) -> Path:
    """Built beside the FLUX models (same cache directory, deterministic builder)."""
    from diffserve.zoo.components import MARKER_FILE
    from diffserve.zoo.qwen_image21 import build_qwen_image21_model

    out = next(iter(models.values())).parent / kind
    if not (out / MARKER_FILE).is_file():
        build_qwen_image21_model(kind, out, seed=0, force=out.exists())
    return out


def _plain(path: Path, dtype: str) -> Any:
    import diffusers

    from diffserve.models.generic.vl_processor import load_qwen3_vl_processor

    pipe = diffusers.QwenImage21Pipeline.from_pretrained(
        str(path),
        torch_dtype=torch_dtype(dtype),
        processor=load_qwen3_vl_processor(path / "processor"),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _timed(
    section: Section, settings: Settings, path: Path, case: Case, dtype: str
) -> None:
    import torch

    from diffserve import Engine, GenerationRequest

    pipe = _plain(path, dtype)
    engine = Engine(str(path), dtype=dtype, enforce_eager=True, env={})

    def diffusers_call() -> Any:
        with torch.inference_mode():
            return pipe(
                prompt=PROMPT,
                height=case.size,
                width=case.size,
                num_inference_steps=case.steps,
                generator=torch.Generator().manual_seed(SEED),
            ).images

    def engine_call() -> Any:
        # A fresh prompt each call: the conditioning cache would skip the encoder.
        request = GenerationRequest(
            prompt=PROMPT,
            height=case.size,
            width=case.size,
            num_inference_steps=case.steps,
            seed=SEED,
            conditioning_cache=False,
        )
        return engine.generate(request).images

    calls: dict[str, Callable[[], Any]] = {
        "diffusers": diffusers_call,
        "diffserve generic": engine_call,
    }
    try:
        samples, last = interleaved(
            calls, warmup=1, iters=settings.iters, budget_s=settings.case_budget_s
        )
    finally:
        shutdown(engine)
    base = median(samples["diffusers"])
    for name, times in samples.items():
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
            round(median(times) / base, 3),
            "" if quality is None else round(quality, 1),
        )
    section.metrics[f"qwen21.{dtype}.ratio"] = (
        median(samples["diffserve generic"]) / base
    )
    del samples, last
    gc.collect()


def _profiled(section: Section, path: Path, case: Case, dtype: str) -> None:
    """One request on the generic pipeline itself under torch's profiler: the share of
    its time in the denoiser's GEMMs and attention, in its other ops, and outside it."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from diffserve.config.resolve import resolve
    from diffserve.models.generic.pipeline import GenericPipeline

    stage = resolve(
        model=path, overrides={"dtype": dtype, "enforce_eager": True}, env={}
    ).stages[0]
    pipeline = GenericPipeline.from_stage(path, stage)
    denoiser = pipeline.denoiser
    forward = denoiser.forward

    def marked(*args: Any, **kwargs: Any) -> Any:
        with record_function("denoiser"):
            return forward(*args, **kwargs)

    denoiser.forward = marked

    def call() -> Any:
        with torch.inference_mode():
            return pipeline.pipe(
                prompt=PROMPT,
                height=case.size,
                width=case.size,
                num_inference_steps=case.steps,
                generator=torch.Generator().manual_seed(SEED),
                output_type="pt",
            )

    def profiled() -> tuple[Any, float]:
        # On the pipeline's compute thread, where its batches run (and where the
        # profiler sees the ops).
        call()  # warm
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            call()
        return prof, time.perf_counter() - start

    prof, total_s = pipeline.compute.call(profiled)
    events = prof.events()
    denoiser_us = sum(e.cpu_time_total for e in events if e.name == "denoiser")
    # The GEMMs and attention inside the denoiser's forwards only (the text encoder's
    # and the VAE's are not what a native denoiser changes).
    kernel_us = sum(
        e.self_cpu_time_total
        for e in events
        if any(op in e.name for op in KERNEL_OPS) and _inside(e, "denoiser")
    )
    total_us = total_s * 1e6
    kernel_share = min(1.0, kernel_us / total_us)
    denoiser_share = min(1.0, denoiser_us / total_us)
    other_share = max(0.0, denoiser_share - kernel_share)
    bound = 1.0 / max(1e-9, 1.0 - other_share)
    verdict = "pays" if bound >= PAYS_AT else "does not pay"
    section.notes.append(
        f"{case.label} {dtype}, one request profiled ({total_s:.3f} s): denoiser "
        f"{denoiser_share:.0%} of the time, of which GEMMs and attention "
        f"{kernel_share:.0%} of the request and its other ops {other_share:.0%}; "
        f"outside the denoiser {1 - denoiser_share:.0%}. A native runner that removed "
        f"all the denoiser's other ops would be at most {bound:.2f}x faster: "
        f"a native path {verdict} (threshold {PAYS_AT}x, native FLUX's low end)."
    )
    section.metrics[f"qwen21.{dtype}.native_bound"] = bound
    section.metrics[f"qwen21.{dtype}.denoiser_share"] = denoiser_share
    section.metrics[f"qwen21.{dtype}.kernel_share"] = kernel_share
    pipeline.compute.stop()
    del prof
    gc.collect()


def _inside(event: Any, name: str) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False
