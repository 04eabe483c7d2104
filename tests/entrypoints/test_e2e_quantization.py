"""``diffserve serve --quantization int8``: the real server process, called with the ``openai`` client, attests
the quantized kernels and layers, reports each component's weight bytes in /v1/config and its ready log line,
and the peak memory of each phase beside the timings."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e
pytest.importorskip("torchao")


def test_serve_quantization_int8(server_launcher, tiny_flux_dir) -> None:
    import openai

    with server_launcher(tiny_flux_dir, "--quantization", "int8", "--text-encoder-quantization", "int8_weight_only",
                         "--dtype", "float32", "--enforce-eager", "--default-steps", "2") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        result = client.images.generate(model="tiny-flux", prompt="a fox", size="64x64", extra_body={"seed": 4})
        info = result.model_extra["diffserve"]
        att = info["attestation"]
        assert att["quantization"]["transformer"]["method"] == "int8"
        assert att["quantization"]["transformer"]["ignored_linears"] == 8
        assert att["linear"]["int8_dynamic"] == 28 * att["transformer_forwards"]
        assert att["quantization"]["text_encoder_2"]["backend"] == "int8_weight_only"
        assert set(info["memory_peak_mib"]) == {"encode", "denoise", "decode"}
        config = httpx.get(server.url + "/v1/config").json()
        assert config["stages"][0]["fields"]["quantization"] == {**config["stages"][0]["fields"]["quantization"],
                                                                  "value": "int8", "source": "cli"}
        weights = config["weights"]
        assert weights["transformer"]["quantization"]["quantized_linears"] == 28
        assert weights["transformer"]["bytes"] < 0.45 * 4 * weights["transformer"]["parameters"]
        assert weights["vae"]["dtype"] == "float32" and weights["vae"]["device"] == "cpu"
        ready = next(line for line in server.log().splitlines() if "worker(s) ready" in line)
        assert "weights: transformer" in ready and "int8 on cpu" in ready and "MiB in all" in ready
