"""(m) Quantized weights: small-flux 256x256/4 per method (none, int8, int8_weight_only, fp8_weight_only) in the
machine's default dtype and in float32, each on its own diffserve Engine (uni, eager): seconds per image and
the ratio to the unquantized engine of the same dtype, the transformer's weight bytes on the device (and their
ratio to bfloat16's), the process's peak resident memory during the request, and the PSNR of the image
against the unquantized one. Beside them diffusers with torchao's int8 (``quantize_`` on its transformer, as
diffusers' ``TorchAoConfig`` does) on the same weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, psnr, spread
from benchmarks.section import Section, Unavailable
from benchmarks.settings import Settings


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    import importlib.util

    from diffserve.config.platform import native_bfloat16

    if importlib.util.find_spec("torchao") is None:
        raise Unavailable('torchao is not installed (pip install "diffserve[quant]")')
    case = settings.quant_case
    path = models[case.model]
    default = "bfloat16" if native_bfloat16()[0] else "float32"
    dtypes = list(dict.fromkeys((default, "float32")))[: 1 if settings.smoke else 2]
    section.columns = ["dtype", "method", "median s/image", "spread ±", "runs", "ratio vs unquantized",
                       "transformer MiB", "bytes vs bfloat16", "peak RSS MiB", "PSNR vs unquantized (dB)",
                       "linear calls"]
    section.notes.append(f"{case.label}; default dtype here: {default}; diffserve engines eager on the uni executor, "
                         "the family's default quantization_ignored_layers; diffusers + torchao int8 quantizes "
                         "every Linear of its transformer.")
    bf16_bytes = None
    for dtype in dtypes:
        base_image, base_s = None, None
        for method in settings.quant_methods:
            engine = C.load_engine(path, dtype, quantization=method)
            try:
                call = C.engine_call(engine, case)
                image = call()[0]  # warm-up, and the image compared
                samples, _ = interleaved({method: call}, warmup=0, iters=settings.iters,
                                         budget_s=settings.case_budget_s)
                out = engine.generate(C.request(case))
                weights = engine.weights["transformer"]
            finally:
                C.shutdown(engine)
            seconds = median(samples[method])
            if method == "none":
                base_image, base_s = image, seconds
                if dtype == "bfloat16" or bf16_bytes is None:
                    bf16_bytes = weights.bytes if dtype == "bfloat16" else weights.bytes / 2
            quality = psnr(image, base_image)
            linear = ", ".join(f"{k} {v}" for k, v in sorted(out.attestation.get("linear", {}).items()))
            section.add(dtype, method, round(seconds, 4), f"{spread(samples[method]):.0%}", len(samples[method]),
                        round(seconds / base_s, 3), round(weights.bytes / 2**20, 1),
                        round(weights.bytes / bf16_bytes, 3), max(out.memory_peak_mib.values()),
                        "identical" if quality == float("inf") else round(quality, 1), linear)
            key = f"quant.{dtype}.{method}"
            section.metrics[f"{key}.ratio"] = seconds / base_s
            section.metrics[f"{key}.bytes_vs_bf16"] = weights.bytes / bf16_bytes
            section.metrics[f"{key}.psnr"] = quality
        if not settings.smoke:
            _diffusers_int8(section, settings, path, dtype, base_image, base_s)


def _diffusers_int8(section: Section, settings: Settings, path: Path, dtype: str, base_image: Any,
                    base_s: float | None) -> None:
    """diffusers' FluxPipeline with torchao int8 (dynamic activations) on every Linear of its transformer."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    from diffserve.models.memory import module_weight_bytes

    pipe = C.load_diffusers(path, dtype)
    quantize_(pipe.transformer, Int8DynamicActivationInt8WeightConfig())
    call = C.diffusers_call(pipe, settings.quant_case)
    image = call()[0]
    samples, _ = interleaved({"diffusers": call}, warmup=0, iters=settings.iters, budget_s=settings.case_budget_s)
    seconds = median(samples["diffusers"])
    transformer_bytes, _ = module_weight_bytes(pipe.transformer)
    section.add(dtype, "diffusers + torchao int8", round(seconds, 4), f"{spread(samples['diffusers']):.0%}",
                len(samples["diffusers"]), round(seconds / base_s, 3) if base_s else "", round(transformer_bytes / 2**20, 1),
                "", "", round(psnr(image, base_image), 1), "")
    section.metrics[f"quant.{dtype}.diffusers_int8.ratio"] = seconds / base_s if base_s else None
