"""GGUF transformers (models/gguf_file.py, layers/linear/gguf.py): files written by the
test with the ``gguf`` package in city96's FLUX layout; weights stay packed (the
transformer's memory is the file's) and are dequantized per call exactly as ggml does,
counted as ``gguf_<type>``; quality gates against the float file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from benchmarks.common import psnr  # noqa: E402
from diffserve.config.resolve import resolve  # noqa: E402
from diffserve.errors import ConfigError, ModelLoadError  # noqa: E402
from diffserve.layers.linear.gguf import BLOCK_FORMATS, QuantizedWeight  # noqa: E402
from diffserve.zoo.flux_checkpoints import write_gguf  # noqa: E402

REQUEST = dict(
    prompt="a red circle on a blue background",
    height=64,
    width=64,
    num_inference_steps=4,
    seed=7,
    output_type="pt",
)
# PSNR floors against the unquantized image, 64x64, 4 steps, float32. Measured (Intel
# AMX, 2 cores): tiny-flux Q8_0 112.2 dB, Q5_1 94.7, Q4_0 87.0, F16 137.6; toy-shapes
# 108.5, 86.0, 82.9, 133.7. The floors sit ~20-45 dB below (the issue asks Q8_0 >= 40
# dB); dequantization itself is exact (test_dequantization_is_ggmls), so only the
# float32 GEMMs' last bits move across CPUs.
FLOORS = {"q8_0": 60.0, "q5_1": 55.0, "q4_0": 50.0, "f16": 80.0}


@pytest.mark.parametrize("qtype", sorted(BLOCK_FORMATS))
def test_dequantization_is_ggmls(qtype: str) -> None:
    import gguf

    kind = gguf.GGMLQuantizationType[qtype.upper()]
    values = np.random.default_rng(0).standard_normal((24, 96)).astype(np.float32) * 3
    packed = gguf.quants.quantize(values, kind)
    reference = gguf.quants.dequantize(packed, kind)
    # As the file holds it.
    raw = torch.from_numpy(np.ascontiguousarray(packed).view(np.uint8).reshape(24, -1))
    ours = QuantizedWeight(qtype, raw, 24, 96).dequantize(torch.float32)
    # Exact although gguf's is numpy: float16 -> float32 is exact and d * q (+ m) are
    # the same correctly rounded elementwise ops in gguf's order, on any CPU (no
    # reduction).
    assert torch.equal(ours, torch.from_numpy(reference.astype(np.float32)))
    assert (
        QuantizedWeight(qtype, raw, 24, 96).rows(8, 16).dequantize().equal(ours[8:16])
    )


def test_k_quants_stay_packed_and_dequantize_as_gguf_does() -> None:
    """gguf cannot quantize K-quants, so the blocks are random bytes with small scales:
    only the packing, the row slicing and the per-call dequantization are under test
    (its numbers are gguf's own)."""
    import gguf

    kind = gguf.GGMLQuantizationType.Q4_K
    values_per_block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    raw = np.random.default_rng(1).integers(
        0, 255, size=(6, 2 * block_bytes), dtype=np.uint8
    )
    # Each block opens with two float16 scales: keep them small and finite.
    for block in range(2):
        raw[:, block * block_bytes : block * block_bytes + 4] = np.frombuffer(
            np.array([0.01, 0.01], dtype=np.float16).tobytes(), dtype=np.uint8
        )
    weight = QuantizedWeight("q4_k", torch.from_numpy(raw), 6, 2 * values_per_block)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, kind).astype(np.float32))
    assert weight.nbytes == raw.nbytes and torch.equal(
        weight.dequantize(torch.float32), expected
    )
    assert torch.equal(weight.rows(2, 4).dequantize(torch.float32), expected[2:4])


def _run(model: Path, **overrides) -> tuple[np.ndarray, dict]:
    from diffserve import Engine, GenerationRequest

    with Engine(str(model), dtype="float32", env={}, **overrides) as engine:
        out = engine.generate(GenerationRequest(**REQUEST))
    return out.images[0].numpy(), out.attestation


@pytest.mark.parametrize("model_name", ["tiny-flux", "toy-shapes"])
def test_gguf_images_pass_their_floors_and_are_attested(
    model_name: str, tiny_flux_dir: Path, tmp_path: Path
) -> None:
    from diffserve.zoo.demo import toy_model_dir

    model = tiny_flux_dir if model_name == "tiny-flux" else toy_model_dir()
    reference, _ = _run(model)
    measured = {}
    for qtype, floor in FLOORS.items():
        path = write_gguf(model, tmp_path / f"{model_name}-{qtype}.gguf", qtype)
        image, attestation = _run(model, components={"transformer": str(path)})
        measured[qtype] = round(psnr(image, reference), 1)
        assert measured[qtype] >= floor, measured
        # Every Linear packed.
        assert set(attestation["linear"]) == {f"gguf_{qtype}"}, attestation["linear"]
    print(f"\n[gguf] {model_name}: PSNR dB vs float32 {measured}")


def test_the_packed_transformer_takes_the_files_memory(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    from diffserve.layers.kernels import build_kernel_set
    from diffserve.models.flux.transformer import load_flux_transformer
    from diffserve.registry.models import MODEL_FAMILIES

    path = write_gguf(tiny_flux_dir, tmp_path / "q8.gguf", "q8_0")
    stage = resolve(
        model=str(tiny_flux_dir), overrides={"dtype": "float32"}, env={}
    ).stages[0]
    kernels = build_kernel_set(
        stage.linear_backend,
        stage.attention_backend,
        roles=MODEL_FAMILIES["FluxPipeline"].attention_roles,
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    model = load_flux_transformer(
        tiny_flux_dir / "transformer", kernels, weights_file=str(path)
    )
    dense = sum(
        t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers())
    )
    packed = sum(
        m.weight.nbytes
        for m in model.modules()
        if isinstance(getattr(m, "weight", None), QuantizedWeight)
    )
    assert (
        packed > 0
        and abs(dense + packed - path.stat().st_size) <= 0.10 * path.stat().st_size
    )


def test_bad_gguf_files_and_compile_are_refused(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    import gguf

    from diffserve.models.flux.pipeline import FluxPipeline

    other = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(other), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ModelLoadError, match="GGUF architecture 'llama', expected 'flux'"
    ):
        FluxPipeline.from_pretrained(
            tiny_flux_dir, components={"transformer": str(other)}
        )
    good = write_gguf(tiny_flux_dir, tmp_path / "q8.gguf").read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
        FluxPipeline.from_pretrained(
            tiny_flux_dir, components={"transformer": str(truncated)}
        )
    with pytest.raises(ConfigError, match="a GGUF transformer runs eager"):
        resolve(
            model=str(tiny_flux_dir),
            overrides={
                "components": {"transformer": str(tmp_path / "q8.gguf")},
                "enforce_eager": False,
            },
            env={},
        )


def test_models_inspect_reports_the_packed_bytes(
    tiny_flux_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import json

    from diffserve.entrypoints.cli import main

    path = write_gguf(tiny_flux_dir, tmp_path / "q8.gguf")
    assert (
        main(
            [
                "models",
                "inspect",
                str(tiny_flux_dir),
                "--transformer",
                str(path),
                "--dtype",
                "float32",
                "--json",
            ]
        )
        == 0
    )
    transformer = next(
        c
        for c in json.loads(capsys.readouterr().out)["components"]
        if c["name"] == "transformer"
    )
    assert transformer["layout"] == "gguf" and transformer["stored_dtypes"].get("Q8_0")
    assert (
        abs(transformer["device_bytes"] - path.stat().st_size)
        <= 0.10 * path.stat().st_size
    )


@pytest.mark.e2e
def test_gguf_with_a_lora_and_the_step_cache_on_mp_workers(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    """The combination a user meets: a GGUF transformer served by mp workers, with a
    per-request LoRA on the packed layers and the step cache; each attested, and the
    adapter changes the image."""
    from diffserve import Engine, GenerationRequest
    from diffserve.zoo.lora import build_flux_lora

    path = write_gguf(tiny_flux_dir, tmp_path / "q8.gguf")
    adapter = build_flux_lora(tiny_flux_dir, tmp_path / "style", seed=1)
    request = dict(REQUEST, num_inference_steps=6, cache_threshold=0.9)
    with Engine(
        str(tiny_flux_dir),
        dtype="float32",
        distributed_executor_backend="mp",
        cache_backend="fbcache",
        components={"transformer": str(path)},
        lora_modules={"style": str(adapter)},
        env={},
    ) as engine:
        plain = engine.generate(GenerationRequest(**request))
        styled = engine.generate(GenerationRequest(**request, loras=[("style", 1.0)]))
    for out in (plain, styled):
        assert out.attestation["executor"] == "mp" and set(
            out.attestation["linear"]
        ) == {"gguf_q8_0"}
        assert out.attestation["cache"][0]["backend"] == "fbcache"
    assert [a["name"] for a in styled.attestation["lora"]["adapters"]] == ["style"]
    assert styled.attestation["lora_linear_calls"] > 0
    assert not np.array_equal(plain.images[0].numpy(), styled.images[0].numpy())
