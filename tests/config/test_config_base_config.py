"""base_config chains: relative paths, merge of stages by stage_id, cycles and missing
files."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_helpers import line_of, run, write

from diffserve.errors import ConfigError


def test_chain_merges_stages_by_stage_id(tmp_path: Path) -> None:
    write(
        tmp_path / "common" / "root.yaml",
        """
        topology: split_text_encoder
        stages:
          - {stage_id: 0, dtype: float16, linear_backend: torch}
          - {stage_id: 1, dtype: float16, max_batch_size: 2}
        platforms: {cpu: {stages: [{stage_id: 1, devices: "0"}]}}
        """,
    )
    write(
        tmp_path / "common" / "mid.yaml",
        """
        base_config: root.yaml
        stages:
          - {stage_id: 1, attention_backend: math}
        """,
    )
    deploy = write(
        tmp_path / "deploy.yaml",
        """
        base_config: common/mid.yaml
        stages:
          - {stage_id: 0, dtype: bfloat16}
        """,
    )
    cfg = run(deploy_config=deploy)
    te, dit = cfg.stages
    assert (te.dtype, te.linear_backend) == ("bfloat16", "torch")
    assert (
        dit.dtype,
        dit.max_batch_size,
        dit.attention_backend.default,
        dit.devices,
    ) == ("float16", 2, "math", (0,))
    assert cfg.deploy_files == tuple(
        str(p.resolve())
        for p in (
            tmp_path / "common" / "root.yaml",
            tmp_path / "common" / "mid.yaml",
            deploy,
        )
    )
    assert cfg.provenance["stages.1.attention_backend.default"].file.endswith(
        "mid.yaml"
    )
    assert cfg.provenance["stages.1.devices"].layer == "platform"


def test_cycle_is_a_config_error_naming_the_line(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "base_config: b.yaml\n")
    b = write(tmp_path / "b.yaml", "dtype: bf16\nbase_config: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle") as info:
        run(deploy_config=tmp_path / "a.yaml")
    assert f"{b.resolve()}:{line_of(b, 'base_config')}" in str(info.value)
    assert info.value.path == "base_config"


def test_self_reference_is_a_cycle(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cycle"):
        run(deploy_config=write(tmp_path / "a.yaml", "base_config: ./a.yaml\n"))


def test_missing_base_file_names_the_referencing_file(tmp_path: Path) -> None:
    deploy = write(tmp_path / "d.yaml", "dtype: bf16\nbase_config: nope.yaml\n")
    with pytest.raises(ConfigError, match="not found") as info:
        run(deploy_config=deploy)
    assert f"{deploy.resolve()}:2" in str(info.value) and "relative to the file" in str(
        info.value
    )


def test_missing_deploy_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        run(deploy_config=tmp_path / "absent.yaml")


def test_empty_file_is_an_empty_config(tmp_path: Path) -> None:
    assert (
        run(deploy_config=write(tmp_path / "e.yaml", "# nothing\n")).fingerprint
        == run().fingerprint
    )
