"""The weight keys at resolve time: quantization methods and their spellings, the
family's ignore list as a model value, and what the device cannot run refused with the
stage key, the device and what would run."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_helpers import run, write

from diffserve.errors import ConfigError
from diffserve.registry.models import MODEL_FAMILIES


def test_spellings_and_provenance(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "deploy.yaml",
        "quantization: W8A8\ntext_encoder_quantization: int8-weight-only\n",
    )
    cfg = run(
        deploy_config=deploy,
        overrides={"quantization_ignored_layers": "final_layer, *.img_mod"},
    )
    stage = cfg.stages[0]
    assert (stage.quantization, stage.text_encoder_quantization) == (
        "int8",
        "int8_weight_only",
    )
    assert stage.quantization_ignored_layers == ("final_layer", "*.img_mod")
    assert cfg.provenance["stages.0.quantization"].layer == "yaml"
    assert cfg.provenance["stages.0.quantization_ignored_layers"].layer == "cli"
    assert cfg.provenance["stages.0.offload"].layer == "default"


def test_the_family_brings_its_ignore_list_as_a_model_value(flux_model: Path) -> None:
    cfg = run(model=flux_model)
    stage = cfg.stages[0]
    assert stage.quantization == "none"  # unquantized unless asked
    assert (
        stage.quantization_ignored_layers
        == MODEL_FAMILIES["FluxPipeline"].features.quantization_ignored_layers
    )
    assert {"img_in", "final_layer", "x_embedder", "proj_out"} <= set(
        stage.quantization_ignored_layers
    )
    assert cfg.provenance["stages.0.quantization_ignored_layers"].layer == "model"
    # An explicit empty list quantizes every Linear layer, and says so.
    cfg = run(model=flux_model, overrides={"quantization_ignored_layers": []})
    assert cfg.stages[0].quantization_ignored_layers == ()
    assert cfg.provenance["stages.0.quantization_ignored_layers"].layer == "cli"


def test_fp8_on_cpu_names_the_stage_key_the_device_and_what_runs(
    tmp_path: Path,
) -> None:
    deploy = write(
        tmp_path / "deploy.yaml", "stages:\n  - stage_id: 0\n    quantization: fp8\n"
    )
    with pytest.raises(ConfigError) as info:
        run(deploy_config=deploy)
    error = info.value
    assert error.path == "stages.0.quantization" and "deploy.yaml" in str(error)
    assert "compute capability >= 8.9" in str(error) and "runs on cpu" in str(error)
    assert "int8, int8_weight_only or fp8_weight_only" in (error.hint or "")
    assert (
        run(overrides={"quantization": "fp8_weight_only"}).stages[0].quantization
        == "fp8_weight_only"
    )


def test_a_misspelt_method_gets_did_you_mean() -> None:
    with pytest.raises(ConfigError) as info:
        run(overrides={"quantization": "int8_weightonly"})
    assert "did you mean 'int8_weight_only'?" in (info.value.hint or "")
    with pytest.raises(ConfigError, match="not a module-name pattern"):
        run(overrides={"quantization_ignored_layers": "final layer"})


@pytest.mark.parametrize("mode", ["model", "sequential"])
def test_offload_on_cpu_says_it_needs_an_accelerator(mode: str) -> None:
    with pytest.raises(ConfigError) as info:
        run(overrides={"offload": mode})
    assert info.value.path == "stages.0.offload" and "accelerator" in str(info.value)
    assert (
        run(overrides={"offload": mode, "enforce_eager": True}, platform="cuda")
        .stages[0]
        .offload
        == mode
    )


def test_sequential_offload_runs_eager() -> None:
    with pytest.raises(ConfigError, match="compiled graph") as info:
        # Cuda compiles unless told otherwise.
        run(overrides={"offload": "sequential"}, platform="cuda")
    assert info.value.path == "stages.0.offload"


def test_a_gguf_transformer_takes_no_second_quantization(tmp_path: Path) -> None:
    gguf = tmp_path / "flux.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="already quantized by its file") as info:
        run(
            overrides={
                "components": {"transformer": str(gguf)},
                "enforce_eager": True,
                "quantization": "int8",
            }
        )
    assert info.value.path == "stages.0.quantization"
