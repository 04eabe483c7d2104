"""The step cache over HTTP and from the CLI: ``cache_threshold`` in the OpenAI client's
``extra_body``, the per-image attestation in the response, 400s naming the field (the
server keeps serving), and ``diffserve generate --cache-backend ... --cache-threshold``.
The server runs int8 weights (``--quantization int8``), as a deployment that wants both
would: the quantized kernels and layers are attested beside the cache's decisions,
/v1/config and the ready log line report each component's weight bytes, and every
response the peak memory of each phase."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
from test_e2e_generate_cli import run_in_process

from diffserve.layers.linear.registry import select_linear_backend

pytestmark = pytest.mark.e2e

STEPS = 12


@pytest.fixture(scope="module")
def cache_server(server_launcher, tiny_flux_dir):
    pytest.importorskip("torchao")
    with server_launcher(
        tiny_flux_dir,
        "--enforce-eager",
        "--cache-backend",
        "fbcache",
        "--cache-max-threshold",
        "0.8",
        "--served-model-name",
        "tiny-flux",
        "--dtype",
        "float32",
        "--quantization",
        "int8",
        "--text-encoder-quantization",
        "int8_weight_only",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def cache_client(cache_server):
    return openai.OpenAI(
        base_url=cache_server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )


def generate(client: openai.OpenAI, **extra):
    return client.images.generate(
        model="tiny-flux",
        prompt="a red fox",
        size="64x64",
        n=2,
        extra_body={"num_inference_steps": STEPS, "seed": 3, **extra},
    )


def test_cache_threshold_in_extra_body_is_attested_per_image(cache_client) -> None:
    result = generate(cache_client, cache_threshold=0.5)
    entries = result.model_extra["diffserve"]["attestation"]["cache"]
    assert len(entries) == 2
    for entry in entries:
        assert entry["backend"] == "fbcache" and entry["threshold"] == 0.5
        assert (
            entry["computed_steps"] + entry["skipped_steps"] == STEPS
            and entry["skipped_steps"] > 0
        )
        assert [step for step, _, _ in entry["trace"]] == list(range(1, STEPS + 1))
        assert {decision for _, _, decision in entry["trace"]} == {"compute", "skip"}
    default = generate(cache_client).model_extra["diffserve"]["attestation"]["cache"][0]
    # The deployment's (fbcache's published default)
    assert default["threshold"] == 0.08


def test_quantized_serving_is_attested_with_weight_bytes_and_phase_peaks(
    cache_server, cache_client
) -> None:
    info = generate(cache_client, cache_threshold=0.5).model_extra["diffserve"]
    att = info["attestation"]
    transformer = att["quantization"]["transformer"]
    assert (transformer["method"], transformer["backend"]) == ("int8", "int8_dynamic")
    # tiny-flux: 36 Linear layers, the family's list keeps the embedders' and the final
    # layer's 8.
    assert (transformer["quantized_linears"], transformer["ignored_linears"]) == (28, 8)
    # Quantized layers on int8 kernels, ignored ones on the stage's backend (exact
    # counts without a cache: tests/models/test_quantization.py; here skipped steps
    # still run block 0).
    # Onednn with AVX512, else torch.
    stage_backend = select_linear_backend("auto", "cpu", torch.float32).name
    assert (
        set(att["linear"]) == {"int8_dynamic", stage_backend}
        and att["linear"]["int8_dynamic"] > 0
    )
    assert att["quantization"]["text_encoder_2"]["backend"] == "int8_weight_only"
    # The cache still skips on int8 weights.
    assert all(entry["skipped_steps"] > 0 for entry in att["cache"])
    assert set(info["memory_peak_mib"]) == {"encode", "denoise", "decode"}
    config = httpx.get(cache_server.url + "/v1/config").json()
    quantization = config["stages"][0]["fields"]["quantization"]
    assert (quantization["value"], quantization["source"]) == ("int8", "cli")
    weights = config["weights"]
    assert weights["transformer"]["quantization"]["quantized_linears"] == 28
    assert (
        weights["transformer"]["bytes"]
        < 0.45 * 4 * weights["transformer"]["parameters"]
    )
    assert weights["vae"]["dtype"] == "float32" and weights["vae"]["device"] == "cpu"
    ready = next(
        line for line in cache_server.log().splitlines() if "worker(s) ready" in line
    )
    assert (
        "weights: transformer" in ready
        and "int8 on cpu" in ready
        and "MiB in all" in ready
    )


def test_metrics_count_skipped_and_computed_steps(cache_client) -> None:
    def counts() -> dict[str, float]:
        text = httpx.get(
            str(cache_client.base_url).removesuffix("/v1/") + "/metrics"
        ).text
        found = {}
        for decision in ("compute", "skip"):
            line = next(
                (
                    li
                    for li in text.splitlines()
                    if li.startswith("diffserve_step_cache_steps_total{")
                    and f'decision="{decision}"' in li
                    and 'backend="fbcache"' in li
                ),
                None,
            )
            found[decision] = float(line.rsplit(" ", 1)[1]) if line else 0.0
        return found

    before = counts()
    entries = generate(cache_client, cache_threshold=0.5).model_extra["diffserve"][
        "attestation"
    ]["cache"]
    after = counts()
    assert (
        after["skip"] - before["skip"] == sum(e["skipped_steps"] for e in entries) > 0
    )
    assert after["compute"] - before["compute"] == sum(
        e["computed_steps"] for e in entries
    )


@pytest.mark.parametrize(
    ("value", "needle"),
    [(0.9, "max_threshold"), (-1, "cache_threshold"), ("high", "cache_threshold")],
)
def test_bad_thresholds_are_400s_naming_the_field(cache_client, value, needle) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        generate(cache_client, cache_threshold=value)
    error = info.value.body
    assert error["param"] == "cache_threshold" and needle in error["message"]
    # Still serving: the smallest request (an int8 GEMM on a CPU without VNNI costs more
    # than a float32 one).
    still = cache_client.images.generate(
        model="tiny-flux",
        prompt="a red fox",
        size="64x64",
        extra_body={"num_inference_steps": 2, "seed": 3, "cache_threshold": 0},
    )
    assert still.data


def test_a_threshold_without_a_cache_backend_is_a_400(client) -> None:
    # The shared uni server has no step cache (cache.backend: none).
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(
            model="tiny-flux",
            prompt="a red fox",
            size="64x64",
            extra_body={"num_inference_steps": 2, "cache_threshold": 0.3},
        )
    assert (
        info.value.body["param"] == "cache_threshold"
        and "cache.backend: none" in info.value.body["message"]
    )


def test_generate_cli_cache_threshold(tiny_flux_dir, tmp_path, capsys) -> None:
    proc = run_in_process(
        capsys,
        "generate",
        tiny_flux_dir,
        "a red fox",
        "-o",
        tmp_path / "fox.png",
        "--seed",
        1,
        "--steps",
        STEPS,
        "--size",
        "64x64",
        "--enforce-eager",
        "--cache-backend",
        "fbcache",
        "--cache-threshold",
        "0.5",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    assert "step cache image 0: fbcache threshold 0.5, skipped" in proc.stdout
    assert f"of {STEPS} steps" in proc.stdout
    refused = run_in_process(
        capsys,
        "generate",
        tiny_flux_dir,
        "a red fox",
        "-o",
        tmp_path / "x.png",
        "--cache-threshold",
        "0.5",
    )
    assert refused.returncode != 0 and "cache.backend is none" in refused.stderr
