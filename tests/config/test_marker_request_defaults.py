"""A model directory's marker file (diffserve_model.json) may declare its own request
defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_helpers import run

from diffserve.errors import ConfigError


def _marker(model: Path, doc: object) -> Path:
    path = model / "diffserve_model.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_marker_request_defaults_replace_the_familys(flux_model: Path) -> None:
    family = run(model=flux_model).stages[0].request_defaults
    marker = _marker(
        flux_model,
        {
            "kind": "toy",
            "request_defaults": {"num_inference_steps": 7, "guidance_scale": 0.0},
        },
    )
    cfg = run(model=flux_model)
    assert (
        cfg.stages[0].request_defaults.num_inference_steps,
        cfg.stages[0].request_defaults.guidance_scale,
    ) == (7, 0.0)
    assert (family.num_inference_steps, family.guidance_scale) != (7, 0.0)
    for key in ("num_inference_steps", "guidance_scale"):
        where = cfg.provenance[f"stages.0.request_defaults.{key}"]
        assert where.layer == "model" and where.file == str(marker)


def test_one_declared_default_keeps_the_familys_other(flux_model: Path) -> None:
    family = run(model=flux_model).stages[0].request_defaults
    _marker(flux_model, {"request_defaults": {"num_inference_steps": 5}})
    cfg = run(model=flux_model)
    assert cfg.stages[0].request_defaults.num_inference_steps == 5
    assert cfg.stages[0].request_defaults.guidance_scale == family.guidance_scale
    assert cfg.provenance["stages.0.request_defaults.guidance_scale"].file == str(
        flux_model / "model_index.json"
    )


def test_a_marker_without_defaults_changes_nothing(flux_model: Path) -> None:
    family = run(model=flux_model).stages[0].request_defaults
    _marker(flux_model, {"kind": "tiny-flux", "builder_version": 1})
    assert run(model=flux_model).stages[0].request_defaults == family


def test_deploy_and_caller_values_still_win(tmp_path: Path, flux_model: Path) -> None:
    _marker(flux_model, {"request_defaults": {"num_inference_steps": 5}})
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        "request_defaults:\n  num_inference_steps: 12\n", encoding="utf-8"
    )
    assert (
        run(model=flux_model, deploy_config=deploy)
        .stages[0]
        .request_defaults.num_inference_steps
        == 12
    )


@pytest.mark.parametrize(
    "doc", [{"request_defaults": {"num_steps": 4}}, {"request_defaults": [4]}]
)
def test_bad_marker_defaults_are_config_errors(flux_model: Path, doc: object) -> None:
    _marker(flux_model, doc)
    with pytest.raises(ConfigError, match="request_default"):
        run(model=flux_model)


def test_a_declared_size_is_the_models_and_video_keys_stay_off_an_image_model(
    flux_model: Path,
) -> None:
    """height and width are no family's defaults (the VAE's sample size, or Wan's 480,
    apply when unset): a model that declares them gets them, with the marker as their
    source. num_frames on an image model is dropped."""
    assert run(model=flux_model).stages[0].request_defaults.height is None
    marker = _marker(
        flux_model, {"request_defaults": {"height": 64, "width": 48, "num_frames": 17}}
    )
    cfg = run(model=flux_model)
    defaults = cfg.stages[0].request_defaults
    assert (defaults.height, defaults.width, defaults.num_frames) == (64, 48, None)
    for key in ("height", "width"):
        where = cfg.provenance[f"stages.0.request_defaults.{key}"]
        assert where.layer == "model" and where.file == str(marker)


def test_a_declared_text_window_is_the_default_and_one_past_the_familys_is_refused(
    tmp_path: Path, flux_model: Path
) -> None:
    # The family's window.
    assert run(model=flux_model).stages[0].request_defaults.max_sequence_length is None
    marker = _marker(flux_model, {"request_defaults": {"max_sequence_length": 32}})
    cfg = run(model=flux_model)
    assert cfg.stages[0].request_defaults.max_sequence_length == 32
    assert cfg.provenance["stages.0.request_defaults.max_sequence_length"].file == str(
        marker
    )
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        "request_defaults:\n  max_sequence_length: 600\n", encoding="utf-8"
    )
    with pytest.raises(
        ConfigError, match="600 text tokens is past FluxPipeline's window of 512"
    ) as info:
        run(model=flux_model, deploy_config=deploy)
    assert "request_defaults.max_sequence_length" in str(info.value) and str(
        deploy
    ) in str(info.value)
