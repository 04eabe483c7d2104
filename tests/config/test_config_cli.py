"""CLI flags derived from the schema, and the `diffserve config` command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from config_helpers import write

from diffserve.config.cli_args import add_config_arguments, config_kwargs_from_args
from diffserve.config.fields import FLAT_LEAVES, STAGE_KEYS
from diffserve.config.resolve import resolve
from diffserve.entrypoints.cli import main
from diffserve.errors import ConfigError


def _parse(*argv: str) -> dict:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return config_kwargs_from_args(parser.parse_args(list(argv)))


def test_every_setting_has_a_flag() -> None:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    for flat in FLAT_LEAVES:
        assert "--" + flat.replace("_", "-") in flags
    for required in (
        "--deploy-config",
        "--dtype",
        "--linear-backend",
        "--attention-backend",
        "--enforce-eager",
        "--no-enforce-eager",
        "--distributed-executor-backend",
        "--num-replicas",
        "--max-batch-size",
        "--tensor-parallel-size",
        "--ulysses-degree",
        "--stage-overrides",
        "--platform",
    ):
        assert required in flags


def test_only_given_flags_become_overrides() -> None:
    assert _parse() == {
        "deploy_config": None,
        "overrides": {},
        "stage_overrides": None,
        "platform": None,
    }
    kwargs = _parse(
        "--dtype",
        "bf16",
        "--no-enforce-eager",
        "--tensor-parallel-size",
        "2",
        "--stage-overrides",
        '{"0": {"linear_backend": "torch"}}',
        "--platform",
        "cpu",
        "--deploy-config",
        "d.yaml",
        "--attention-backend",
        '{"default": "sdpa"}',
    )
    assert kwargs["overrides"] == {
        "dtype": "bf16",
        "enforce_eager": False,
        "tensor_parallel_size": "2",
        "attention_backend": {"default": "sdpa"},
    }
    assert kwargs["stage_overrides"] == {"0": {"linear_backend": "torch"}}
    assert (kwargs["platform"], kwargs["deploy_config"]) == ("cpu", "d.yaml")


def test_flags_resolve_per_stage(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "d.yaml", "topology: split_text_encoder\nlinear_backend: torch\n"
    )
    kwargs = _parse(
        "--deploy-config",
        str(deploy),
        "--max-batch-size",
        "3",
        "--platform",
        "cpu",
        "--stage-overrides",
        '{"1": {"linear_backend": "auto"}}',
    )
    cfg = resolve(env={}, **kwargs)
    assert [s.linear_backend for s in cfg.stages] == ["torch", "auto"]
    assert [s.max_batch_size for s in cfg.stages] == [3, 3]


def test_bad_stage_overrides_json() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        _parse("--stage-overrides", "{0: nope}")
    with pytest.raises(ConfigError, match="JSON object"):
        _parse("--stage-overrides", "[1]")


def test_explain_json_command(
    tmp_path: Path, capsys, monkeypatch, flux_model: Path
) -> None:
    for var in [v for v in __import__("os").environ if v.startswith("DIFFSERVE_")]:
        monkeypatch.delenv(var)
    deploy = write(
        tmp_path / "d.yaml", "stages: [{stage_id: 0, linear_backend: torch}]\n"
    )
    assert (
        main(
            [
                "config",
                "explain",
                str(flux_model),
                "--deploy-config",
                str(deploy),
                "--platform",
                "cpu",
                "--dtype",
                "fp32",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    fields = doc["stages"][0]["fields"]
    assert fields["linear_backend"] == {
        "value": "torch",
        "source": "yaml",
        "location": f"{deploy.resolve()}:1",
    }
    assert fields["dtype"]["value"] == "float32" and fields["dtype"]["source"] == "cli"
    assert doc["pipeline"]["topology"]["source"] == "model"


def test_explain_table_and_validate(tmp_path: Path, capsys) -> None:
    assert (
        main(["config", "explain", "--platform", "cpu", "--linear-backend", "torch"])
        == 0
    )
    out = capsys.readouterr().out
    assert any(
        line.split()[:4] == ["0", "linear_backend", "torch", "cli"]
        for line in out.splitlines()
    )
    assert main(["config", "validate", "--platform", "cpu"]) == 0
    bad = write(tmp_path / "bad.yaml", "dtyp: bf16\nlinear_backend: cutlass\n")
    assert (
        main(["config", "validate", "--deploy-config", str(bad), "--platform", "cpu"])
        == 1
    )
    err = capsys.readouterr().err
    assert "did you mean 'dtype'" in err and "cutlass" in err and "2 problem(s)" in err


def test_validate_and_explain_refuse_a_component_the_family_does_not_read(
    tiny_wan_dir: Path, tmp_path: Path, capsys
) -> None:
    weights = write(tmp_path / "flux1-dev.safetensors", "")
    deploy = write(tmp_path / "d.yaml", f"components:\n  transformer: {weights}\n")
    for command in ("validate", "explain"):
        assert (
            main(
                [
                    "config",
                    command,
                    str(tiny_wan_dir),
                    "--deploy-config",
                    str(deploy),
                    "--platform",
                    "cpu",
                ]
            )
            == 1
        )
        err = capsys.readouterr().err
        assert (
            f"{deploy.resolve()}:1: stages.0.components.transformer: "
            "WanPipeline does not read its transformer "
            "from a single file" in err
        ), err


def test_schema_command(capsys) -> None:
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    # A stages entry: a diffusion or an AR stage.
    diffusion, ar = schema["properties"]["stages"]["items"]["anyOf"]
    assert (
        ar["properties"]["kind"] == {"const": "ar"}
        and ar["additionalProperties"] is True
    )
    stage_props = diffusion["properties"]
    assert set(STAGE_KEYS) <= set(stage_props)
    assert stage_props["linear_backend"]["enum"] == ["auto", "torch", "onednn"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]["platforms"]["properties"]) == {
        "cpu",
        "cuda",
        "rocm",
        "xpu",
        "mps",
    }
