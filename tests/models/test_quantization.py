"""Quantized denoisers through the engine: what ran is attested (kernel counts per
method, layers quantized and ignored, per component), the weights take fewer bytes, the
image stays close to the unquantized one, and the generic path quantizes the same
way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from diffserve import Engine, GenerationRequest
from diffserve.layers.linear.registry import select_linear_backend
from diffserve.models.flux.pipeline import FluxPipeline

pytest.importorskip("torchao")

REQUEST = dict(
    prompt="a red fox in the snow",
    height=64,
    width=64,
    num_inference_steps=2,
    seed=3,
    max_sequence_length=32,
)


def psnr(a: Any, b: Any) -> float:
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_int8_engine_attests_counts_ignores_bytes_and_phases(
    tiny_flux_dir: Path,
) -> None:
    reference = FluxPipeline.from_pretrained(tiny_flux_dir, dtype="float32")(
        GenerationRequest(**REQUEST)
    )
    with Engine(
        str(tiny_flux_dir),
        env={},
        dtype="float32",
        quantization="int8",
        text_encoder_quantization="int8_weight_only",
    ) as engine:
        out = engine.generate(GenerationRequest(**REQUEST))
        weights = engine.weights
    att = out.attestation
    transformer = att["quantization"]["transformer"]
    assert transformer["method"] == "int8" and transformer["backend"] == "int8_dynamic"
    # tiny-flux: 36 Linear layers; the family's list keeps the 8 of the embedders and
    # the final layer.
    assert (transformer["quantized_linears"], transformer["ignored_linears"]) == (28, 8)
    assert "final_layer" in transformer["ignored_patterns"]
    forwards = att["transformer_forwards"]
    # Every quantized layer, every forward.
    assert att["linear"]["int8_dynamic"] == 28 * forwards
    # Onednn with AVX512, else torch.
    stage_backend = select_linear_backend("auto", "cpu", torch.float32).name
    # The ignored ones on the stage's backend.
    assert att["linear"][stage_backend] == 8 * forwards
    for encoder in ("text_encoder", "text_encoder_2"):
        assert att["quantization"][encoder]["method"] == "int8_weight_only"
        assert att["quantization"][encoder]["quantized_linears"] > 0
    # Bytes on the device: int8 data + scales for the quantized layers, float32 for the
    # rest.
    assert weights["transformer"].quantization == transformer
    assert weights["transformer"].bytes < 0.45 * 4 * weights["transformer"].parameters
    assert (
        weights["vae"].quantization is None
        and weights["vae"].bytes == 4 * weights["vae"].parameters
    )
    assert set(out.memory_peak_mib) == {"encode", "denoise", "decode"}
    assert all(v > 0 for v in out.memory_peak_mib.values())
    assert psnr(out.images[0], reference.images[0]) >= 30


def test_the_generic_path_quantizes_its_denoiser(tiny_sd3_dir: Path) -> None:
    with Engine(
        str(tiny_sd3_dir), env={}, dtype="float32", quantization="int8_weight_only"
    ) as engine:
        out = engine.generate(
            GenerationRequest(
                prompt="a fox", height=64, width=64, num_inference_steps=2, seed=1
            )
        )
        weights = engine.weights
    att = out.attestation
    entry = att["quantization"]["transformer"]
    assert att["implementation"] == "generic" and entry["backend"] == "int8_weight_only"
    assert entry["ignored_linears"] > 0 and "proj_out" in entry["ignored_patterns"]
    assert (
        att["linear"]["int8_weight_only"]
        == entry["quantized_linears"] * att["transformer_forwards"]
    )
    # Text_encoder_quantization stays none.
    assert "text_encoder" not in att["quantization"]
    assert set(weights) >= {"transformer", "vae", "text_encoder"} and set(
        out.memory_peak_mib
    ) == {"encode", "denoise", "decode"}


@pytest.mark.numerics
def test_small_flux_quality_gate(small_flux_dir: Path) -> None:
    """small-flux (its real widths) float32 against unquantized: >= 30 dB for int8, >=
    40 dB for int8 weight-only. 128x128/2 steps measure 64.1 and 67.3 dB (AVX2), as
    256x256/4 steps do 64.8 and 67.2 (docs/quantization.md): the error is per GEMM, not
    per pixel; on AVX2 an int8 GEMM (no VNNI) costs ~2x float32, so the gate stays
    small."""
    request = GenerationRequest(
        prompt="a red fox in the snow, watercolor",
        height=128,
        width=128,
        seed=42,
        num_inference_steps=2,
        max_sequence_length=16,
    )
    images = {
        method: FluxPipeline.from_pretrained(
            small_flux_dir, dtype="float32", quantization=method
        )(request).images[0]
        for method in ("none", "int8", "int8_weight_only")
    }
    assert psnr(images["int8"], images["none"]) >= 30
    assert psnr(images["int8_weight_only"], images["none"]) >= 40
    # The quantized GEMMs did run.
    assert not np.array_equal(images["int8"], images["none"])
