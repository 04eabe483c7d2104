"""The parallel layout rules (config/layout.py:require_runnable, run when the executor
is built): which degrees FLUX runs, on which executors, and what a refusal says (key
path, file:line, the fix)."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_helpers import write

from diffserve.config.layout import require_runnable
from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError


def _check(model: Path | None, executor: str, parallel: dict[str, int]) -> None:
    config = resolve(
        model=str(model) if model else None,
        deploy_config={"distributed_executor_backend": executor, "parallel": parallel},
        env={},
    )
    require_runnable(config, config.stage_for_role("diffusion"))


@pytest.mark.parametrize("executor", ["mp", "ray"])
@pytest.mark.parametrize(
    "parallel",
    [
        {"cfg_parallel_size": 2},
        {"ulysses_degree": 4},
        {"cfg_parallel_size": 2, "ulysses_degree": 2},
    ],
)
def test_flux_runs_cfg_and_ulysses_on_multi_rank_executors(
    flux_model: Path, executor: str, parallel: dict[str, int]
) -> None:
    _check(flux_model, executor, parallel)


def test_flux_world_size_is_capped(flux_model: Path) -> None:
    with pytest.raises(
        ConfigError, match="FluxPipeline runs at most 16 ranks per replica"
    ):
        _check(flux_model, "mp", {"cfg_parallel_size": 2, "ulysses_degree": 16})


def test_uni_refuses_two_ranks_and_names_the_executors_that_run_them(
    flux_model: Path,
) -> None:
    with pytest.raises(ConfigError) as info:
        _check(flux_model, "uni", {"cfg_parallel_size": 2})
    message = str(info.value)
    assert "stages.0.parallel" in message and "'uni' executor runs 1" in message
    assert "distributed_executor_backend: mp or ray" in message


@pytest.mark.parametrize(
    "degree, words",
    [
        ("tensor_parallel_size", "tensor parallelism"),
        ("ring_degree", "ring-attention sequence parallelism"),
    ],
)
def test_degrees_flux_does_not_implement_are_refused_by_key(
    flux_model: Path, degree: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _check(flux_model, "mp", {degree: 2})
    message = str(info.value)
    assert f"stages.0.parallel.{degree}" in message
    assert f"FluxPipeline does not run {words}" in message
    assert f"set parallel.{degree}: 1" in message
    assert "this model runs: cfg_parallel_size, ulysses_degree" in message


def test_cfg_parallel_above_two_is_refused_with_file_and_line(
    tmp_path: Path, flux_model: Path
) -> None:
    deploy = write(
        tmp_path / "deploy.yaml",
        "distributed_executor_backend: mp\nparallel:\n  cfg_parallel_size: 4\n",
    )
    config = resolve(model=str(flux_model), deploy_config=str(deploy), env={})
    with pytest.raises(ConfigError) as info:
        require_runnable(config, config.stage_for_role("diffusion"))
    message = str(info.value)
    assert (
        "stages.0.parallel.cfg_parallel_size" in message
        and "true CFG has two branches" in message
    )
    assert f"{deploy}:3" in message


def test_a_model_less_stage_starts_any_ranks_of_any_degree() -> None:
    # No model: the ranks serve RPCs only (the executor conformance suite), nothing to
    # parallelize.
    _check(None, "mp", {"ulysses_degree": 2})
