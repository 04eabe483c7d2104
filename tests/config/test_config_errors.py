"""Every ConfigError names the file and line (or the source), the key path, the rule and
the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_helpers import run, write

from diffserve.errors import ConfigError, ConfigErrors


def _error(tmp_path: Path, text: str, **kwargs) -> ConfigError:
    deploy = write(tmp_path / "d.yaml", text)
    with pytest.raises(ConfigError) as info:
        run(deploy_config=deploy, **kwargs)
    return info.value


def test_unknown_key_has_line_and_did_you_mean(tmp_path: Path) -> None:
    err = _error(
        tmp_path, "dtype: bf16\nstages:\n  - stage_id: 0\n    linear_backed: torch\n"
    )
    assert err.path == "stages[stage_id=0].linear_backed"
    assert err.source == f"{(tmp_path / 'd.yaml').resolve()}:4"
    assert "did you mean 'linear_backend'" in str(err)


def test_flat_name_in_yaml_points_to_its_section(tmp_path: Path) -> None:
    err = _error(tmp_path, "tensor_parallel_size: 2\n")
    assert "parallel: {tensor_parallel_size: ...}" in str(err)


def test_pipeline_only_key_inside_a_stage(tmp_path: Path) -> None:
    err = _error(tmp_path, "stages: [{stage_id: 0, server: {max_n: 2}}]\n")
    assert "pipeline-wide only" in str(err)


def test_bad_enum_lists_valid_values(tmp_path: Path) -> None:
    err = _error(tmp_path, "attention_backend: xformers\n")
    assert (
        "auto, sdpa, math, flash_attn" in str(err) and err.path == "attention_backend"
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("max_batch_size: four\n", "not an integer"),
        ("max_batch_size: true\n", "not an integer"),
        ("enforce_eager: maybe\n", "not a boolean"),
        ("parallel: 3\n", "expected a mapping"),
        ("stages: {stage_id: 0}\n", "expected a list"),
        ("stages: [{dtype: bf16}]\n", "no stage_id"),
        ("stages: [{stage_id: -1}]\n", "not a stage number"),
        ("stages: [{stage_id: 0}, {stage_id: 0}]\n", "appears twice"),
        ("warmup: {height: 100}\n", "multiple of 16"),
        ("worker_extension_cls: not a path\n", "dotted import path"),
        ("devices: gpu0\n", "device list"),
        ("attention_backend: {default: sdpa, cross: math}\n", "unknown key 'cross'"),
        ("dtype: bf16\ndtype: fp32\n", "duplicate key"),
        ("dtype: [unclosed\n", "invalid YAML"),
        ("- just\n- a list\n", "must be a mapping"),
        ("platforms: {cdua: {dtype: bf16}}\n", "did you mean 'cuda'"),
        ("platforms: {cuda: {dtyp: bf16}}\n", "did you mean 'dtype'"),
        ("platforms: {cpu: {base_config: x.yaml}}\n", "unknown key 'base_config'"),
        ("stages: [{stage_id: 0, role: diffusion}]\n", "fixed by the topology"),
        ("1: x\n", "not a string"),
    ],
)
def test_rule_violations(tmp_path: Path, text: str, needle: str) -> None:
    err = _error(tmp_path, text)
    assert needle in str(err)
    assert str(tmp_path) in str(err)


def test_stage_id_missing_from_topology_in_yaml_and_overrides(tmp_path: Path) -> None:
    err = _error(tmp_path, "stages: [{stage_id: 1, dtype: bf16}]\n")
    assert (
        "stage_id 1 does not exist in topology 'single'" in str(err)
        and ":1" in err.source
    )
    with pytest.raises(ConfigError, match="stage_id 2 does not exist") as info:
        run(
            overrides={"topology": "split_text_encoder"},
            stage_overrides={"2": {"dtype": "bf16"}},
        )
    assert info.value.path == "stage_overrides.2"


def test_unknown_platform_name_given_by_the_caller() -> None:
    with pytest.raises(ConfigError, match="not a valid platform.*cpu, cuda"):
        run(platform="tpu")


def test_unknown_override_and_env_names_suggest_the_field() -> None:
    with pytest.raises(ConfigError, match="did you mean 'max_batch_size'"):
        run(overrides={"max_batch": 2})
    with pytest.raises(ConfigError, match="DIFFSERVE_LINEAR_BACKEND"):
        run(env={"DIFFSERVE_LINEAR_BACKEN": "torch"})
    # Not config fields: ignored rather than rejected.
    run(
        env={
            "DIFFSERVE_LOG_LEVEL": "DEBUG",
            "DIFFSERVE_CACHE_DIR": "/tmp",
            "DIFFSERVE_UNRELATED_TOOL_X": "1",
        }
    )


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="DIFFSERVE_NUM_REPLICAS.*below the minimum"):
        run(env={"DIFFSERVE_NUM_REPLICAS": "0"})


def test_all_problems_are_reported_together(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "d.yaml",
        "dtyp: x\nlinear_backend: cutlass\nstages: [{stage_id: 5}]\n",
    )
    with pytest.raises(ConfigErrors) as info:
        run(deploy_config=deploy, stage_overrides={0: {"num_replicas": "many"}})
    assert len(info.value.errors) == 4
    assert all(isinstance(e, ConfigError) for e in info.value.errors)


def test_model_directory_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model directory not found"):
        run(model=tmp_path / "absent")
    with pytest.raises(ConfigError, match="no model_index.json"):
        run(model=tmp_path)
    (tmp_path / "model_index.json").write_text(
        json.dumps({"_class_name": "StableDiffusionPipeline"})
    )
    with pytest.raises(
        ConfigError,
        match="StableDiffusionPipeline.*supported text-to-image DiT "
        "pipelines: FluxPipeline",
    ):
        run(model=tmp_path)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": 3},
        {"deploy_config": 3.5},
        {"overrides": ["dtype"]},
        {"stage_overrides": {"x": {}}},
        {"stage_overrides": {0: "bf16"}},
    ],
)
def test_wrong_argument_types_are_config_errors(kwargs) -> None:
    with pytest.raises(ConfigError):
        run(**kwargs)


def test_pipeline_only_names_in_stage_overrides() -> None:
    with pytest.raises(ConfigError, match="pipeline-wide only"):
        run(stage_overrides={0: {"max_queue": 3}})
    with pytest.raises(ConfigError, match="pipeline-wide only"):
        run(stage_overrides={0: {"topology": "single"}})


def test_unknown_engine_keyword_lists_each_valid_key_once() -> None:
    from diffserve.config.resolve import resolve

    with pytest.raises(ConfigError) as info:
        resolve(model=None, overrides={"speculative_steps": 4}, env={})
    listed = str(info.value).split("valid keys: ")[1].rstrip(")").split(", ")
    assert "attention_backend" in listed and len(listed) == len(set(listed)), listed
