"""Weight quantization methods by name: what each stores and computes, what it needs,
how it is counted.

``config`` derives the allowed ``quantization`` / ``text_encoder_quantization`` values
and the resolve-time device rule from this table; ``layers/linear/quantized.py`` builds
each method's torchao config from it. GGUF files (``models/gguf_file.py``) are a method
of their own, chosen by the file, not by this key.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffserve.registry.targets import spelling_table


@dataclass(frozen=True)
class QuantizationMethod:
    name: str  # the config value
    doc: str
    # The linear backend name a quantized layer's calls are counted under (the
    # attestation's kernel counters).
    backend: str
    # "module:attr" of the torchao config class or a function returning the config,
    # called with no arguments (fp8's picks per-row scales: torchao's default is one
    # scale per tensor, measured slower than bfloat16 on an H200).
    torchao_config: str
    # The accelerator it needs, or None when it runs on any device (CPU included): CUDA
    # compute capability.
    min_cuda_capability: tuple[int, int] | None = None
    weight_bits: int = 8


QUANTIZATION_METHODS: dict[str, QuantizationMethod] = {
    method.name: method
    for method in (
        QuantizationMethod("none", "the stage's dtype, unquantized", "", ""),
        QuantizationMethod(
            "int8",
            "W8A8: int8 weights (per output channel) and activations "
            "quantized per token at run time, "
            "int8 GEMMs",
            "int8_dynamic",
            "torchao.quantization:Int8DynamicActivationInt8WeightConfig",
        ),
        QuantizationMethod(
            "int8_weight_only",
            "int8 weights (per output channel), dequantized into "
            "the activation's dtype",
            "int8_weight_only",
            "torchao.quantization:Int8WeightOnlyConfig",
        ),
        QuantizationMethod(
            "fp8",
            "W8A8 float8 (e4m3): weights per output row and activations "
            "per token scaled at run time, row-wise scaled float8 GEMMs "
            "(compiled: enforce_eager false)",
            "fp8_dynamic",
            "diffserve.layers.linear.quantized:fp8_rowwise_config",
            min_cuda_capability=(8, 9),
        ),
        QuantizationMethod(
            "fp8_weight_only",
            "float8 (e4m3) weights per output channel, dequantized "
            "into the activation's dtype",
            "fp8_weight_only",
            "torchao.quantization:Float8WeightOnlyConfig",
        ),
    )
}
QUANTIZATION_ALIASES: dict[str, str] = {
    "off": "none",
    "no": "none",
    "w8a8": "int8",
    "int8_dynamic": "int8",
    "w8a16": "int8_weight_only",
    "int8wo": "int8_weight_only",
    "float8": "fp8",
    "fp8_dynamic": "fp8",
    "w8a8_fp8": "fp8",
    "fp8wo": "fp8_weight_only",
    "float8_weight_only": "fp8_weight_only",
}
# The optional package the methods run on, and the extra that installs it
# (config/requirements.py).
QUANTIZATION_PACKAGE = "torchao"
QUANTIZATION_EXTRA = "quant"

# Where the weights are offloaded to while another component (or block) runs:
# accelerators only.
OFFLOAD_MODES: dict[str, str] = {
    "none": "every component stays on the stage's device",
    "model": "component level: the text encoders and the VAE leave "
    "the device while the denoiser runs, and "
    "the denoiser while they run",
    "sequential": "block level: the denoiser's blocks live in host memory "
    "and are copied to the device one "
    "at a time, the next one prefetched on a copy stream while the current one runs",
}
OFFLOAD_ALIASES: dict[str, str] = {
    "off": "none",
    "no": "none",
    "cpu": "model",
    "model_cpu_offload": "model",
    "block": "sequential",
    "layer": "sequential",
}


def quantization_spellings() -> dict[str, str]:
    return spelling_table(list(QUANTIZATION_METHODS), QUANTIZATION_ALIASES)


def offload_spellings() -> dict[str, str]:
    return spelling_table(list(OFFLOAD_MODES), OFFLOAD_ALIASES)
