"""The acceptance list of the deploy-config issue, one test (at least) per line."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_helpers import line_of, run, write

FIELDS = (
    "dtype",
    "linear_backend",
    "attention_backend.default",
    "enforce_eager",
    "distributed_executor_backend",
)


def _value(cfg, stage_id: int, key: str):
    stage = cfg.stage(stage_id)
    if key == "attention_backend.default":
        return stage.attention_backend.default
    return getattr(stage, key)


def test_yaml_only_values_reach_the_stage_with_file_and_line(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "deploy.yaml",
        """
        stages:
          - stage_id: 0
            linear_backend: torch
            attention_backend: sdpa
            enforce_eager: true
            distributed_executor_backend: uni
        """,
    )
    cfg = run(deploy_config=deploy)
    stage = cfg.stages[0]
    assert stage.linear_backend == "torch"
    assert stage.attention_backend.default == "sdpa"
    assert stage.attention_backend.for_role("double_block") == "sdpa"
    assert stage.enforce_eager is True
    assert stage.distributed_executor_backend == "uni"
    for key, needle in [
        ("linear_backend", "linear_backend"),
        ("attention_backend.default", "attention"),
        ("enforce_eager", "enforce_eager"),
        ("distributed_executor_backend", "distributed"),
    ]:
        source = cfg.provenance[f"stages.0.{key}"]
        assert source.layer == "yaml"
        assert source.location == f"{deploy.resolve()}:{line_of(deploy, needle)}"
        assert cfg.is_explicit(f"stages.0.{key}")


def test_no_yaml_gives_defaults_recorded_as_default_and_never_explicit() -> None:
    cfg = run()  # cpu, with the suite's "no native bfloat16" pin (tests/conftest.py)
    stage = cfg.stages[0]
    assert (
        stage.dtype,
        stage.linear_backend,
        stage.attention_backend.default,
        stage.enforce_eager,
        stage.distributed_executor_backend,
    ) == ("float32", "auto", "auto", True, "uni")
    assert stage.attention_backend.roles == {}
    platform_keys = {"dtype", "enforce_eager"}  # config/platform_defaults.py
    for key in FIELDS:
        expected = "platform-default" if key in platform_keys else "default"
        assert cfg.provenance[f"stages.0.{key}"].layer == expected
        assert not cfg.is_explicit(f"stages.0.{key}")
    assert all(
        s.layer in ("default", "platform-default") for s in cfg.provenance.values()
    )


# (yaml value, cli value, cli per-stage value) for each field, each differing from the
# one before.
TRIPLES = {
    "dtype": ("float16", "bfloat16", "float32"),
    "linear_backend": ("torch", "auto", "torch"),
    "attention_backend": ("math", "sdpa", "flash_attn"),
    "enforce_eager": (True, False, True),
    # Two executors are registered (uni, mp): each value still differs from the layer
    # below it.
    "distributed_executor_backend": ("mp", "uni", "mp"),
}
FIELD_KEY = {"attention_backend": "attention_backend.default"}


def _yaml_stage(tmp_path: Path, field: str, value) -> Path:
    text = str(value).lower() if isinstance(value, bool) else value
    return write(
        tmp_path / "deploy.yaml", f"stages:\n  - stage_id: 0\n    {field}: {text}\n"
    )


@pytest.mark.parametrize("field", list(TRIPLES))
def test_cli_beats_yaml(tmp_path: Path, field: str) -> None:
    yaml_value, cli_value, _ = TRIPLES[field]
    deploy = _yaml_stage(tmp_path, field, yaml_value)
    key = FIELD_KEY.get(field, field)
    assert _value(run(deploy_config=deploy), 0, key) == yaml_value
    cfg = run(deploy_config=deploy, overrides={field: cli_value})
    assert _value(cfg, 0, key) == cli_value
    assert cfg.provenance[f"stages.0.{key}"].layer == "cli"


@pytest.mark.parametrize("field", list(TRIPLES))
def test_per_stage_cli_beats_global_cli(field: str) -> None:
    _, cli_value, stage_value = TRIPLES[field]
    key = FIELD_KEY.get(field, field)
    cfg = run(overrides={field: cli_value}, stage_overrides={0: {field: stage_value}})
    assert _value(cfg, 0, key) == stage_value
    assert cfg.provenance[f"stages.0.{key}"].layer == "cli_stage"


@pytest.mark.parametrize("field", list(TRIPLES))
def test_global_cli_beats_a_yaml_stage_value(tmp_path: Path, field: str) -> None:
    yaml_value, cli_value, _ = TRIPLES[field]
    # The YAML sets the field both pipeline-wide and on the stage; the stage value is
    # the stronger one.
    deploy = write(
        tmp_path / "deploy.yaml", _yaml_stage(tmp_path, field, yaml_value).read_text()
    )
    key = FIELD_KEY.get(field, field)
    cfg = run(deploy_config=deploy, overrides={field: cli_value})
    assert _value(cfg, 0, key) == cli_value


def test_split_text_encoder_keeps_per_stage_backends_apart(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "deploy.yaml",
        """
        topology: split_text_encoder
        stages:
          - {stage_id: 0, linear_backend: auto, attention_backend: math}
          - {stage_id: 1, linear_backend: torch, attention_backend: sdpa}
        """,
    )
    cfg = run(deploy_config=deploy)
    assert [s.role for s in cfg.stages] == ["text_encoder", "diffusion"]
    te, dit = cfg.stage_for_role("text_encoder"), cfg.stage_for_role("diffusion")
    assert (te.linear_backend, te.attention_backend.default) == ("auto", "math")
    assert (dit.linear_backend, dit.attention_backend.default) == ("torch", "sdpa")

    cfg2 = run(
        deploy_config=deploy,
        stage_overrides={"1": {"linear_backend": "auto", "dtype": "bf16"}},
    )
    assert cfg2.stages[0] == cfg.stages[0]
    assert (
        cfg2.stages[1].linear_backend == "auto" and cfg2.stages[1].dtype == "bfloat16"
    )
    assert cfg2.provenance["stages.0.linear_backend"].layer == "yaml"
    assert cfg2.provenance["stages.0.dtype"].layer == "platform-default"


def test_platform_env_cli_order_and_inert_platform(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "deploy.yaml",
        """
        linear_backend: auto
        dtype: float32
        platforms:
          cpu: {dtype: float16}
          cuda: {dtype: bfloat16, linear_backend: torch}
        """,
    )
    cfg = run(deploy_config=deploy)
    assert cfg.stages[0].dtype == "float16"  # platform beats yaml
    assert cfg.provenance["stages.0.dtype"].layer == "platform"
    assert cfg.provenance["stages.0.dtype"].line == line_of(deploy, "cpu:")
    assert cfg.stages[0].linear_backend == "auto"  # the cuda block is inert on cpu
    cfg = run(deploy_config=deploy, env={"DIFFSERVE_DTYPE": "bf16"})
    assert cfg.stages[0].dtype == "bfloat16"  # env beats platform
    assert cfg.provenance["stages.0.dtype"].detail == "DIFFSERVE_DTYPE"
    cfg = run(
        deploy_config=deploy,
        env={"DIFFSERVE_DTYPE": "bf16"},
        overrides={"dtype": "fp32"},
    )
    assert cfg.stages[0].dtype == "float32"  # cli beats env
    cfg = run(deploy_config=deploy, platform="cuda")
    assert (cfg.stages[0].dtype, cfg.stages[0].linear_backend) == ("bfloat16", "torch")
