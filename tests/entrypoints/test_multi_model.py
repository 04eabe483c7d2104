"""One server, several models: ``diffserve serve A B`` and a deploy file's ``models:``
list. Each model runs on its own engine with its own config; a request's ``model`` picks
one (none: the first that serves that API; unknown: 404); /v1/models, /health, /ready,
/metrics and /v1/config answer per model."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from diffserve.config.model_list import model_entries
from diffserve.errors import ConfigError

pytestmark = pytest.mark.e2e

BODY = {"prompt": "a fox", "size": "64x64", "num_inference_steps": 1, "seed": 3}


@pytest.fixture(scope="module")
def two_models(server_launcher, write_deploy, tiny_flux_dir, tiny_wan_dir):
    """tiny-flux (images) with two replicas and tiny-wan (videos) with one, named by the
    deploy file."""
    deploy = write_deploy(f"""
models:
  - model: {tiny_flux_dir}
    name: flux
    num_replicas: 2
    distributed_executor_backend: uni
  - model: {tiny_wan_dir}
    name: wan
    distributed_executor_backend: uni
    request_defaults: {{num_frames: 5, num_inference_steps: 2}}
""")
    with server_launcher("--deploy-config", deploy) as server:
        yield server


def test_every_model_is_listed_and_answers_by_name(two_models) -> None:
    client = openai.OpenAI(
        base_url=two_models.url + "/v1", api_key="unused", max_retries=0, timeout=60
    )
    cards = {m.id: m.model_extra["diffserve"] for m in client.models.list().data}
    assert list(cards) == ["flux", "wan"]
    assert (cards["flux"]["makes"], cards["wan"]["makes"]) == ("images", "videos")
    assert (
        cards["wan"]["defaults"]["num_frames"] == 5
        and cards["flux"]["defaults"]["size"] == "128x128"
    )
    image = client.images.generate(
        prompt="a fox", size="64x64", extra_body={"num_inference_steps": 1, "seed": 1}
    )
    assert (
        image.model_extra["diffserve"]["attestation"]["model_family"] == "FluxPipeline"
    )
    # No model: the first video model.
    video = client.videos.create(prompt="a fox running", size="64x48")
    assert video.model == "wan"
    deadline = time.monotonic() + 60
    while video.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.1)
        video = client.videos.retrieve(video.id)
    assert (
        video.status == "completed"
        and video.model_extra["diffserve"]["num_frames"] == 5
    ), video


def test_a_request_for_the_wrong_api_or_an_unknown_model_is_refused(two_models) -> None:
    wrong = httpx.post(
        two_models.url + "/v1/images/generations",
        json={**BODY, "model": "wan"},
        timeout=30,
    )
    assert (
        wrong.status_code == 400
        and wrong.json()["error"]["code"] == "model_makes_videos"
    ), wrong.text
    wrong = httpx.post(
        two_models.url + "/v1/videos",
        json={"model": "flux", "prompt": "a fox"},
        timeout=30,
    )
    assert (
        wrong.status_code == 400
        and wrong.json()["error"]["code"] == "model_makes_images"
    ), wrong.text
    unknown = httpx.post(
        two_models.url + "/v1/images/generations",
        json={**BODY, "model": "sdxl"},
        timeout=30,
    )
    assert (
        unknown.status_code == 404
        and unknown.json()["error"]["code"] == "model_not_found"
    )
    assert (
        "flux" in unknown.json()["error"]["message"]
        and "wan" in unknown.json()["error"]["message"]
    )
    assert httpx.get(two_models.url + "/v1/models/sdxl").status_code == 404
    assert httpx.get(two_models.url + "/v1/models/wan").json()["id"] == "wan"


def test_health_ready_metrics_and_config_answer_per_model(two_models) -> None:
    health = httpx.get(two_models.url + "/health").json()
    assert health["status"] == "ok"
    assert (
        health["models"]["flux"]["replicas"] == 2
        and health["models"]["wan"]["replicas"] == 1
    ), health
    ready = httpx.get(two_models.url + "/ready").json()
    assert ready["status"] == "ready" and set(ready["models"]) == {"flux", "wan"}
    gauges = {
        (s.name, s.labels.get("model")): s.value
        for family in text_string_to_metric_families(
            httpx.get(two_models.url + "/metrics").text
        )
        for s in family.samples
        if s.name.startswith("diffserve_model_")
    }
    assert (
        gauges[("diffserve_model_ready", "flux")]
        == gauges[("diffserve_model_ready", "wan")]
        == 1.0
    )
    assert (
        gauges[("diffserve_model_replicas", "flux")] == 2.0
        and gauges[("diffserve_model_replicas", "wan")] == 1.0
    )
    wan = httpx.get(two_models.url + "/v1/config", params={"model": "wan"}).json()
    flux = httpx.get(two_models.url + "/v1/config").json()  # no model: the first
    assert wan["model"] != flux["model"] and wan["fingerprint"] != flux["fingerprint"]


def test_several_models_on_the_command_line(
    server_launcher, tiny_flux_dir, tiny_sd3_dir
) -> None:
    with server_launcher(
        tiny_flux_dir, tiny_sd3_dir, "--distributed-executor-backend", "uni"
    ) as server:
        ids = [
            card["id"] for card in httpx.get(server.url + "/v1/models").json()["data"]
        ]
        assert ids == [tiny_flux_dir.name, tiny_sd3_dir.name]
        for model, family in (
            (tiny_sd3_dir.name, "StableDiffusion3Pipeline"),
            (None, "FluxPipeline"),
        ):
            body = {**BODY, "model": model} if model else BODY
            answer = httpx.post(
                server.url + "/v1/images/generations", json=body, timeout=60
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["diffserve"]["attestation"]["model_family"] == family


def test_a_models_file_is_checked_before_anything_loads(
    tmp_path: Path, tiny_flux_dir: Path
) -> None:
    def write(text: str) -> Path:
        path = tmp_path / "deploy.yaml"
        path.write_text(text, encoding="utf-8")
        return path

    listed = write(
        f"models:\n  - model: {tiny_flux_dir}\n    name: a\n  - other.yaml\n"
    )
    with pytest.raises(ConfigError, match="deploy file not found"):
        model_entries([], listed)
    (tmp_path / "other.yaml").write_text(
        f"model: {tiny_flux_dir}\nmax_batch_size: 2\n", encoding="utf-8"
    )
    entries = model_entries([], listed)
    assert [e.name for e in entries] == ["a", None] and entries[1].deploy_config == str(
        tmp_path / "other.yaml"
    )
    with pytest.raises(ConfigError, match="names one place|command line names"):
        model_entries([str(tiny_flux_dir)], listed)
    with pytest.raises(ConfigError, match="holds nothing else"):
        model_entries(
            [], write(f"max_batch_size: 2\nmodels:\n  - model: {tiny_flux_dir}\n")
        )
    with pytest.raises(ConfigError, match="non-empty list"):
        model_entries([], write("models: {}\n"))
    from diffserve.config.resolve import resolve

    with pytest.raises(ConfigError, match="several models"):
        resolve(deploy_config=write(f"models:\n  - model: {tiny_flux_dir}\n"), env={})


def test_two_models_with_one_name_fail_the_start(
    tmp_path: Path, tiny_flux_dir: Path, capsys
) -> None:
    from diffserve.entrypoints.cli import main

    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        f"models:\n  - model: {tiny_flux_dir}\n  - model: {tiny_flux_dir}\n "
        "   max_batch_size: 2\n",
        encoding="utf-8",
    )
    assert main(["serve", "--deploy-config", str(deploy), "--port", "1"]) == 1
    assert "two models answer to" in capsys.readouterr().err
