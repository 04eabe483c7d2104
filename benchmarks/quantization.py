"""(m) Quantized weights: small-flux 256x256/4 per method (none, int8, int8_weight_only,
fp8_weight_only) in the machine's default dtype and in float32, each on its own
diffserve Engine (uni, eager) in a fresh process (so the peak resident memory is the
method's own, not what earlier engines left in the allocator): seconds per image and the
ratio to the unquantized engine of the same dtype, the transformer's weight bytes on the
device (and their ratio to bfloat16's), the process's peak resident memory during the
request, and the PSNR of the image against the unquantized one. Beside them diffusers
with torchao's int8 (``quantize_`` on every Linear of its transformer, what diffusers'
``TorchAoConfig`` does) on the same weights, also in a process of its own."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import psnr
from benchmarks.section import Section, Unavailable
from benchmarks.settings import Case, Settings

DIFFUSERS_INT8 = "diffusers + torchao int8"


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    import importlib.util

    from diffserve.config.platform import native_bfloat16

    if importlib.util.find_spec("torchao") is None:
        raise Unavailable('torchao is not installed (pip install "diffserve[quant]")')
    case = settings.quant_case
    path = models[case.model]
    default = "bfloat16" if native_bfloat16()[0] else "float32"
    dtypes = list(dict.fromkeys((default, "float32")))[: 1 if settings.smoke else 2]
    section.columns = [
        "dtype",
        "method",
        "median s/image",
        "spread ±",
        "runs",
        "ratio vs unquantized",
        "transformer MiB",
        "bytes vs bfloat16",
        "peak RSS MiB",
        "PSNR vs unquantized (dB)",
        "linear calls",
    ]
    section.notes.append(
        f"{case.label}; default dtype here: {default}; diffserve "
        "engines eager on the uni executor "
        "with the family's default quantization_ignored_layers; "
        "each row measured in a fresh process."
    )
    bf16_bytes = None
    for dtype in dtypes:
        methods = [
            *settings.quant_methods,
            *([] if settings.smoke else [DIFFUSERS_INT8]),
        ]
        runs = {
            method: _in_fresh_process(path, dtype, method, case, settings)
            for method in methods
        }
        base = runs["none"]
        if bf16_bytes is None or dtype == "bfloat16":
            bf16_bytes = base["bytes"] if dtype == "bfloat16" else base["bytes"] / 2
        for method, run in runs.items():
            quality = psnr(run["image"], base["image"])
            seconds = run["seconds"]
            section.add(
                dtype,
                method,
                round(seconds, 4),
                f"{run['spread']:.0%}",
                run["runs"],
                round(seconds / base["seconds"], 3),
                round(run["bytes"] / 2**20, 1),
                round(run["bytes"] / bf16_bytes, 3),
                round(run["peak_rss_mib"]),
                "identical" if quality == float("inf") else round(quality, 1),
                run["linear"],
            )
            named = "diffusers_int8" if method == DIFFUSERS_INT8 else method
            key = f"quant.{dtype}.{named}"
            section.metrics[f"{key}.ratio"] = seconds / base["seconds"]
            section.metrics[f"{key}.bytes_vs_bf16"] = run["bytes"] / bf16_bytes
            section.metrics[f"{key}.psnr"] = quality
        if DIFFUSERS_INT8 in runs:
            ours = runs["int8"]["seconds"] / runs[DIFFUSERS_INT8]["seconds"]
            section.metrics[f"quant.{dtype}.int8.vs_diffusers"] = ours
            section.notes.append(
                f"{dtype}: diffserve int8 / diffusers + torchao int8 "
                f"= {ours:.3f} s/image"
            )


def _in_fresh_process(
    path: Path, dtype: str, method: str, case: Case, settings: Settings
) -> dict[str, Any]:
    # the harness only (its numbers mean nothing): the same function, without the spawn
    if settings.smoke:
        return _run(path, dtype, method, case, settings.iters, settings.case_budget_s)
    with ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        return pool.submit(
            _run, path, dtype, method, case, settings.iters, settings.case_budget_s
        ).result()


def _run(
    path: Path, dtype: str, method: str, case: Case, iters: int, budget_s: float | None
) -> dict[str, Any]:
    """One contender in this (fresh) process: warm-up image, timed images, bytes, peak
    RSS of a request."""
    from benchmarks import contenders as C
    from benchmarks.common import interleaved, median, pin_threads, spread
    from diffserve.models.memory import PhasePeaks, module_weight_bytes

    pin_threads()
    if method == DIFFUSERS_INT8:
        import torch
        from torchao.quantization import (
            Int8DynamicActivationInt8WeightConfig,
            quantize_,
        )

        pipe = C.load_diffusers(path, dtype)
        quantize_(pipe.transformer, Int8DynamicActivationInt8WeightConfig())
        call = C.diffusers_call(pipe, case)
        image = np.asarray(call()[0])
        samples, _ = interleaved(
            {method: call}, warmup=0, iters=iters, budget_s=budget_s
        )
        peaks = PhasePeaks(torch.device("cpu"))
        peaks.start("request")
        call()
        peaks.stop()
        return {
            "image": image,
            "seconds": median(samples[method]),
            "spread": spread(samples[method]),
            "runs": len(samples[method]),
            "bytes": module_weight_bytes(pipe.transformer)[0],
            "peak_rss_mib": peaks.peaks["request"],
            "linear": "",
        }
    engine = C.load_engine(path, dtype, quantization=method)
    try:
        call = C.engine_call(engine, case)
        image = np.asarray(call()[0])
        samples, _ = interleaved(
            {method: call}, warmup=0, iters=iters, budget_s=budget_s
        )
        out = engine.generate(C.request(case))
        linear = ", ".join(
            f"{k} {v}" for k, v in sorted(out.attestation.get("linear", {}).items())
        )
        return {
            "image": image,
            "seconds": median(samples[method]),
            "spread": spread(samples[method]),
            "runs": len(samples[method]),
            "bytes": engine.weights["transformer"].bytes,
            "peak_rss_mib": max(out.memory_peak_mib.values()),
            "linear": linear,
        }
    finally:
        C.shutdown(engine)
