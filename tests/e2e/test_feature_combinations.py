"""The features users combine, as one request each, attested as such: LoRA-patched,
step-cached requests streaming a partial image on worker processes with Ulysses=2 (int8
weights), with true CFG split over two ranks (int8 weight-only), and as an image edit,
each against the same request on one in-process rank; int8 weights on two replicas.
Edits on parallel layouts are refused (400 ``image``), not run wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from background import generate_together

from diffserve import Engine, GenerationRequest
from diffserve.errors import RequestError
from diffserve.zoo.lora import build_flux_lora

pytestmark = pytest.mark.e2e


def psnr(a: Any, b: Any) -> float:
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def lora(tiny_flux_dir, tmp_path_factory) -> str:
    return str(
        build_flux_lora(
            tiny_flux_dir, tmp_path_factory.mktemp("combo") / "style", seed=3
        )
    )


def engine(model_dir: Any, lora: str, **layout: Any) -> Engine:
    return Engine(
        str(model_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        lora_modules=f"style={lora}",
        cache={"backend": "fbcache"},
        **layout,
    )


PICTURE = np.zeros((64, 64, 3), np.uint8)
PICTURE[:, 32:] = (30, 60, 220)


@pytest.mark.parametrize(
    "layout",
    [
        {"ulysses_degree": 2, "quantization": "int8"},
        {"cfg_parallel_size": 2, "quantization": "int8_weight_only"},
        {},
    ],
    ids=["ulysses2-int8", "cfg2-int8wo", "edit"],
)
def test_lora_cache_and_parallel_in_one_request(
    tiny_flux_dir, lora: str, layout: dict[str, int]
) -> None:
    edit = {"images": (PICTURE,), "strength": 0.9} if not layout else {}
    cfg = (
        {"negative_prompt": "blurry", "true_cfg_scale": 2.0}
        if "cfg_parallel_size" in layout
        else {}
    )
    request = dict(
        prompt="a fox",
        height=64,
        width=64,
        num_inference_steps=4,
        seed=5,
        max_sequence_length=32,
        loras=[("style", 0.8)],
        cache_threshold=0.6,
        **edit,
        **cfg,
    )
    # Parallel layouts need worker processes; the edit runs on mp too (its inputs cross
    # the process boundary).
    with engine(
        tiny_flux_dir, lora, distributed_executor_backend="mp", **layout
    ) as parallel:
        previews: list = []
        out = parallel.generate(
            GenerationRequest(**request, partial_images=1),
            on_progress=lambda e: previews.append(e) if e.preview is not None else None,
        )
        if layout:
            with pytest.raises(RequestError) as info:
                parallel.generate(
                    GenerationRequest(**{**request, "images": (PICTURE,)})
                )
            assert info.value.param == "image"
    quantized = (
        {"quantization": layout["quantization"]} if "quantization" in layout else {}
    )
    with engine(tiny_flux_dir, lora, **quantized) as single:
        reference = single.generate(GenerationRequest(**request))
        base = single.generate(GenerationRequest(**{**request, "loras": ()}))
    att = out.attestation
    assert att["executor"] == "mp" and att["parallel"]["world_size"] == (
        2 if layout else 1
    )
    # every rank quantized its transformer, and the adapter's delta ran beside the int8
    # GEMMs
    if quantized:
        method = att["quantization"]["transformer"]["backend"]
        assert att["linear"][method] > 0 and all(
            tally["linear"][method] > 0 for tally in att["per_rank"]
        )
    else:
        assert "quantization" not in att
    assert (
        att["lora"] == {"adapters": [{"name": "style", "scale": 0.8}]}
        and att["lora_linear_calls"] > 0
    )
    assert (
        att["cache"][0]["backend"] == "fbcache" and att["cache"][0]["threshold"] == 0.6
    )
    # Ranks exchanged tensors only on a parallel layout.
    assert bool(att["collectives"]) == bool(layout)
    # Its partial image crossed the process boundary from rank 0 (the Ulysses shards
    # gathered first).
    assert [(e.preview_index, tuple(e.preview.shape)) for e in previews] == [
        (0, (1, 64, 64, 3))
    ]
    # The same request on one rank (with no partial image).
    assert psnr(out.images[0], reference.images[0]) >= 40
    assert psnr(out.images[0], base.images[0]) < 40  # and the adapter really applied


def test_int8_weights_on_two_replicas(tiny_flux_dir) -> None:
    """Each replica's worker process quantizes its own transformer; both serve, images
    as one in-process rank."""
    request = dict(
        prompt="a fox",
        height=64,
        width=64,
        num_inference_steps=2,
        max_sequence_length=32,
    )
    with Engine(
        str(tiny_flux_dir), env={}, dtype="float32", quantization="int8"
    ) as single:
        reference = {
            seed: single.generate(GenerationRequest(seed=seed, **request)).images[0]
            for seed in (1, 2)
        }
    with Engine(
        str(tiny_flux_dir),
        env={},
        dtype="float32",
        quantization="int8",
        num_replicas=2,
        distributed_executor_backend="mp",
    ) as replicas:
        outs = generate_together(
            replicas, {s: GenerationRequest(seed=s, **request) for s in (1, 2)}
        )
    assert {out.attestation["replica"] for out in outs.values()} == {0, 1}
    for seed, out in outs.items():
        assert out.attestation["quantization"]["transformer"]["quantized_linears"] == 28
        assert (
            out.attestation["linear"]["int8_dynamic"]
            == 28 * out.attestation["transformer_forwards"]
        )
        assert np.array_equal(np.asarray(out.images[0]), np.asarray(reference[seed]))
