"""The step cache over HTTP and from the CLI: ``cache_threshold`` in the OpenAI client's ``extra_body``,
the per-image attestation in the response, 400s naming the field (the server keeps serving), and
``diffserve generate --cache-backend ... --cache-threshold``."""

from __future__ import annotations

import httpx
import openai
import pytest
from test_e2e_generate_cli import run_cli

pytestmark = pytest.mark.e2e

STEPS = 12


@pytest.fixture(scope="module")
def cache_client(server_launcher, tiny_flux_dir):
    with server_launcher(tiny_flux_dir, "--enforce-eager", "--cache-backend", "fbcache", "--cache-max-threshold",
                         "0.8", "--served-model-name", "tiny-flux") as server:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def generate(client: openai.OpenAI, **extra):
    return client.images.generate(model="tiny-flux", prompt="a red fox", size="64x64", n=2,
                                  extra_body={"num_inference_steps": STEPS, "seed": 3, **extra})


def test_cache_threshold_in_extra_body_is_attested_per_image(cache_client) -> None:
    result = generate(cache_client, cache_threshold=0.5)
    entries = result.model_extra["diffserve"]["attestation"]["cache"]
    assert len(entries) == 2
    for entry in entries:
        assert entry["backend"] == "fbcache" and entry["threshold"] == 0.5
        assert entry["computed_steps"] + entry["skipped_steps"] == STEPS and entry["skipped_steps"] > 0
        assert [step for step, _, _ in entry["trace"]] == list(range(1, STEPS + 1))
        assert {decision for _, _, decision in entry["trace"]} == {"compute", "skip"}
    default = generate(cache_client).model_extra["diffserve"]["attestation"]["cache"][0]
    assert default["threshold"] == 0.08  # the deployment's (fbcache's published default)


def test_metrics_count_skipped_and_computed_steps(cache_client) -> None:
    def counts() -> dict[str, float]:
        text = httpx.get(str(cache_client.base_url).removesuffix("/v1/") + "/metrics").text
        found = {}
        for decision in ("compute", "skip"):
            line = next((li for li in text.splitlines() if li.startswith("diffserve_step_cache_steps_total{")
                         and f'decision="{decision}"' in li and 'backend="fbcache"' in li), None)
            found[decision] = float(line.rsplit(" ", 1)[1]) if line else 0.0
        return found

    before = counts()
    entries = generate(cache_client, cache_threshold=0.5).model_extra["diffserve"]["attestation"]["cache"]
    after = counts()
    assert after["skip"] - before["skip"] == sum(e["skipped_steps"] for e in entries) > 0
    assert after["compute"] - before["compute"] == sum(e["computed_steps"] for e in entries)


@pytest.mark.parametrize(("value", "needle"), [(0.9, "max_threshold"), (-1, "cache_threshold"),
                                               ("high", "cache_threshold")])
def test_bad_thresholds_are_400s_naming_the_field(cache_client, value, needle) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        generate(cache_client, cache_threshold=value)
    error = info.value.body
    assert error["param"] == "cache_threshold" and needle in error["message"]
    assert generate(cache_client, cache_threshold=0).data  # still serving


def test_a_threshold_without_a_cache_backend_is_a_400(client) -> None:
    # The shared uni server has no step cache (cache.backend: none).
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(model="tiny-flux", prompt="a red fox", size="64x64",
                               extra_body={"num_inference_steps": 2, "cache_threshold": 0.3})
    assert info.value.body["param"] == "cache_threshold" and "cache.backend: none" in info.value.body["message"]


def test_generate_cli_cache_threshold(tiny_flux_dir, tmp_path) -> None:
    proc = run_cli("generate", tiny_flux_dir, "a red fox", "-o", tmp_path / "fox.png", "--seed", 1, "--steps",
                   STEPS, "--size", "64x64", "--enforce-eager", "--cache-backend", "fbcache", "--cache-threshold",
                   "0.5", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "step cache image 0: fbcache threshold 0.5, skipped" in proc.stdout
    assert f"of {STEPS} steps" in proc.stdout
    refused = run_cli("generate", tiny_flux_dir, "a red fox", "-o", tmp_path / "x.png", "--cache-threshold", "0.5",
                      timeout=120)
    assert refused.returncode != 0 and "cache.backend is none" in refused.stderr
