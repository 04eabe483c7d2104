"""One test per adjacent pair of layers, stage-vs-pipeline inside a layer, and deep
merges."""

from __future__ import annotations

from pathlib import Path

from config_helpers import run, write


def test_model_beats_default(flux_model: Path) -> None:
    assert run().provenance["topology"].layer == "default"
    cfg = run(model=flux_model)
    assert cfg.topology == "single" and cfg.provenance["topology"].layer == "model"
    assert cfg.model == str(flux_model.resolve())


def test_base_config_ancestor_beats_model(tmp_path: Path, flux_model: Path) -> None:
    write(tmp_path / "base.yaml", "topology: split_text_encoder\n")
    deploy = write(tmp_path / "deploy.yaml", "base_config: base.yaml\n")
    cfg = run(model=flux_model, deploy_config=deploy)
    assert cfg.topology == "split_text_encoder"
    assert cfg.provenance["topology"].file == str((tmp_path / "base.yaml").resolve())


def test_deploy_yaml_beats_its_base(tmp_path: Path) -> None:
    write(
        tmp_path / "base.yaml",
        "stages: [{stage_id: 0, linear_backend: torch, max_batch_size: 2}]\n",
    )
    deploy = write(
        tmp_path / "deploy.yaml", "base_config: base.yaml\nlinear_backend: auto\n"
    )
    cfg = run(deploy_config=deploy)
    # Layers first: the child's pipeline-wide value beats the base's stage value.
    assert cfg.stages[0].linear_backend == "auto"
    assert cfg.provenance["stages.0.linear_backend"].file == str(deploy.resolve())
    assert cfg.stages[0].max_batch_size == 2


def test_platform_beats_deploy_yaml_even_a_stage_value(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "d.yaml",
        """
        stages: [{stage_id: 0, max_batch_size: 2}]
        platforms: {cpu: {max_batch_size: 3}}
        """,
    )
    cfg = run(deploy_config=deploy)
    assert cfg.stages[0].max_batch_size == 3
    assert cfg.provenance["stages.0.max_batch_size"].layer == "platform"


def test_env_beats_platform(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "d.yaml",
        "platforms: {cpu: {stages: [{stage_id: 0, linear_backend: torch}]}}\n",
    )
    cfg = run(deploy_config=deploy, env={"DIFFSERVE_LINEAR_BACKEND": "AUTO"})
    assert cfg.stages[0].linear_backend == "auto"
    assert cfg.provenance["stages.0.linear_backend"].layer == "env"


def test_cli_beats_env() -> None:
    env = {"DIFFSERVE_ENFORCE_EAGER": "1", "DIFFSERVE_MAX_QUEUE": "5"}
    cfg = run(env=env)
    assert cfg.stages[0].enforce_eager is True and cfg.server.max_queue == 5
    cfg = run(env=env, overrides={"enforce_eager": False, "max_queue": 6})
    assert cfg.stages[0].enforce_eager is False and cfg.server.max_queue == 6
    assert cfg.provenance["server.max_queue"].layer == "cli"


def test_cli_stage_beats_cli() -> None:
    cfg = run(overrides={"num_replicas": 2}, stage_overrides={"0": {"num_replicas": 3}})
    assert cfg.stages[0].num_replicas == 3


def test_inside_one_layer_a_stage_value_beats_a_pipeline_wide_one(
    tmp_path: Path,
) -> None:
    deploy = write(
        tmp_path / "d.yaml",
        """
        topology: split_text_encoder
        dtype: bfloat16
        stages: [{stage_id: 1, dtype: float32}]
        """,
    )
    cfg = run(deploy_config=deploy)
    assert [s.dtype for s in cfg.stages] == ["bfloat16", "float32"]


def test_explicit_auto_is_a_choice_distinct_from_unset(tmp_path: Path) -> None:
    write(tmp_path / "base.yaml", "linear_backend: torch\n")
    deploy = write(
        tmp_path / "d.yaml", "base_config: base.yaml\nlinear_backend: auto\n"
    )
    cfg = run(deploy_config=deploy)
    assert cfg.stages[0].linear_backend == "auto" and cfg.is_explicit(
        "stages.0.linear_backend"
    )
    # None means "not given", never "auto".
    cfg = run(overrides={"linear_backend": None})
    assert not cfg.is_explicit("stages.0.linear_backend")


def test_nested_sections_deep_merge_across_layers(tmp_path: Path) -> None:
    write(
        tmp_path / "base.yaml",
        """
        warmup: {enabled: true, height: 256}
        parallel: {ring_degree: 2}
        """,
    )
    deploy = write(
        tmp_path / "d.yaml",
        """
        base_config: base.yaml
        warmup: {width: 512}
        stages: [{stage_id: 0, parallel: {ulysses_degree: 2}}]
        platforms: {cpu: {warmup: {steps: 3}}}
        """,
    )
    cfg = run(
        deploy_config=deploy,
        env={"DIFFSERVE_WARMUP_HEIGHT": "64"},
        overrides={"parallel": {"cfg_parallel_size": 2}},
        stage_overrides={0: {"tensor_parallel_size": 2}},
    )
    stage = cfg.stages[0]
    assert (
        stage.warmup.enabled,
        stage.warmup.height,
        stage.warmup.width,
        stage.warmup.steps,
    ) == (True, 64, 512, 3)
    assert (
        stage.parallel.tensor_parallel_size,
        stage.parallel.cfg_parallel_size,
        stage.parallel.ulysses_degree,
        stage.parallel.ring_degree,
    ) == (2, 2, 2, 2)
    layers = {
        k.removeprefix("stages.0."): v.layer
        for k, v in cfg.provenance.items()
        if k.startswith("stages.0.")
    }
    assert layers["warmup.enabled"] == "yaml" and layers["warmup.height"] == "env"
    assert (
        layers["warmup.steps"] == "platform"
        and layers["parallel.tensor_parallel_size"] == "cli_stage"
    )


def test_attention_roles_merge_and_a_plain_name_sets_every_role(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "d.yaml", "attention_backend: {default: sdpa, double_block: math}\n"
    )
    cfg = run(deploy_config=deploy)
    backend = cfg.stages[0].attention_backend
    assert (
        backend.for_role("double_block") == "math"
        and backend.for_role("single_block") == "sdpa"
    )
    cfg = run(
        deploy_config=deploy,
        stage_overrides={0: {"attention_backend": {"single_block": "flash_attn"}}},
    )
    backend = cfg.stages[0].attention_backend
    assert dict(backend.roles) == {"double_block": "math", "single_block": "flash_attn"}
    cfg = run(deploy_config=deploy, overrides={"attention_backend": "math"})
    assert (
        cfg.stages[0].attention_backend.default == "math"
        and cfg.stages[0].attention_backend.roles == {}
    )


def test_model_goes_through_the_same_path_with_or_without_yaml(
    tmp_path: Path, flux_model: Path
) -> None:
    without = run(model=flux_model)
    with_yaml = run(
        model=flux_model, deploy_config=write(tmp_path / "d.yaml", "dtype: bf16\n")
    )
    assert without.provenance["topology"] == with_yaml.provenance["topology"]
    assert without.provenance["topology"].layer == "model"
    assert with_yaml.stages[0].dtype == "bfloat16" and without.model == with_yaml.model


def test_yaml_stage_value_and_cli_spelling_differences_raise_no_warnings(
    tmp_path: Path,
) -> None:
    deploy = write(
        tmp_path / "d.yaml",
        "stages: [{stage_id: 0, linear_backend: TORCH, attention_backend: SDPA}]\n",
    )
    cfg = run(
        deploy_config=deploy,
        overrides={"linear_backend": "torch", "attention_backend": "torch_sdpa"},
    )
    assert cfg.warnings == ()
    assert cfg.provenance["stages.0.linear_backend"].layer == "cli"
