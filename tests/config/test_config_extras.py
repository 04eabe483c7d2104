"""extras keys that name typed fields: equal canonical values fold silently, different
ones warn once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from config_helpers import run, write

from diffserve.errors import ConfigError


def _deploy(tmp_path: Path, typed: str, extras: str) -> Path:
    return write(
        tmp_path / "deploy.yaml",
        f"""
        stages:
          - stage_id: 0
            {typed}
            extras: {{{extras}, model_knob: 7}}
        """,
    )


@pytest.mark.parametrize(
    ("typed", "extras"),
    [
        ("linear_backend: TORCH", "linear_backend: torch"),
        ("linear_backend: torch", "linear_backend: TORCH"),
        ("attention_backend: SDPA", "attention_backend: torch_sdpa"),
        ("attention_backend: {default: sdpa}", "attention_backend: SDPA"),
        ("dtype: bf16", "dtype: torch.bfloat16"),
        ("parallel: {ulysses_degree: 2}", "ulysses_degree: '2'"),
    ],
)
def test_equal_canonical_values_fold_without_warning(
    tmp_path: Path, caplog, typed: str, extras: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="diffserve"):
        cfg = run(deploy_config=_deploy(tmp_path, typed, extras))
    assert cfg.warnings == ()
    assert not caplog.records
    # Folded away; the model key stays.
    assert dict(cfg.stages[0].extras) == {"model_knob": 7}
    assert "stages.0.extras.model_knob" in cfg.provenance


def test_different_values_give_exactly_one_warning_and_the_typed_field_wins(
    tmp_path: Path,
) -> None:
    cfg = run(
        deploy_config=_deploy(tmp_path, "linear_backend: auto", "linear_backend: TORCH")
    )
    assert cfg.stages[0].linear_backend == "auto"
    assert len(cfg.warnings) == 1
    warning = cfg.warnings[0]
    assert (
        "'torch'" in warning and "'auto'" in warning and "typed field wins" in warning
    )
    assert "linear_backend='auto'" in warning.split("using", 1)[1]
    assert "extras.linear_backend" in warning and str(tmp_path) in warning


def test_conflict_with_a_default_still_warns_once(tmp_path: Path) -> None:
    deploy = write(tmp_path / "d.yaml", "extras: {attention_backend: math}\n")
    cfg = run(deploy_config=deploy)
    assert cfg.stages[0].attention_backend.default == "auto"
    assert len(cfg.warnings) == 1 and "(default)" in cfg.warnings[0]
    assert cfg.stages[0].extras == {}


def test_invalid_value_for_a_typed_extras_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="extras.linear_backend.*cutlass"):
        run(
            deploy_config=write(
                tmp_path / "d.yaml", "extras: {linear_backend: cutlass}\n"
            )
        )


def test_extras_merge_per_key_across_layers_and_are_read_only(tmp_path: Path) -> None:
    deploy = write(tmp_path / "d.yaml", "extras: {a: 1, b: {x: [1, 2]}}\n")
    cfg = run(deploy_config=deploy, stage_overrides={0: {"extras": {"a": 2}}})
    extras = cfg.stages[0].extras
    assert extras == {"a": 2, "b": {"x": (1, 2)}}
    assert cfg.provenance["stages.0.extras.a"].layer == "cli_stage"
    assert cfg.provenance["stages.0.extras.b"].layer == "yaml"
    with pytest.raises(TypeError):
        extras["a"] = 3  # type: ignore[index]
