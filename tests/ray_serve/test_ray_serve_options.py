"""What the Ray Serve front asks Ray Serve for (no cluster here): ``server.autoscaling``
mapped key for key and accepted by Ray Serve's own config model, the per-replica
options, and the builder's ``serve run`` arguments."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError
from diffserve.ray_serve.builder import model_list, spec_from_args
from diffserve.ray_serve.options import deployment_options

SCALING = {
    "autoscaling_min_replicas": 2,
    "autoscaling_max_replicas": 6,
    "autoscaling_target_ongoing_requests": 3,
    "autoscaling_upscale_delay_s": 1.5,
    "autoscaling_downscale_delay_s": 45,
    "autoscaling_metrics_interval_s": 0.5,
    "autoscaling_look_back_period_s": 4,
    "max_queue": 9,
    "batch_deadline_floor_s": 77,
}


def test_importing_the_package_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, diffserve.ray_serve; print(sorted(m for "
        "m in ('ray', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_autoscaling_maps_key_for_key_and_ray_serve_accepts_it() -> None:
    from ray.serve.config import AutoscalingConfig

    options = deployment_options([resolve(overrides=SCALING, platform="cpu", env={})])
    scaling = options["autoscaling_config"]
    assert scaling == {
        "min_replicas": 2,
        "initial_replicas": 2,
        "max_replicas": 6,
        "target_ongoing_requests": 3.0,
        "upscale_delay_s": 1.5,
        "downscale_delay_s": 45.0,
        "metrics_interval_s": 0.5,
        "look_back_period_s": 4.0,
    }
    # Ray Serve's own validation (min <= initial <= max, positive values)
    parsed = AutoscalingConfig(**scaling)
    assert (parsed.min_replicas, parsed.max_replicas, parsed.look_back_period_s) == (
        2,
        6,
        4.0,
    )
    # A replica accepts more than the target (so the load it measures can ask for
    # another), bounded.
    assert options["max_ongoing_requests"] == 6 > scaling["target_ongoing_requests"]
    assert (
        options["max_queued_requests"] == 9
        and options["graceful_shutdown_timeout_s"] == 77.0
    )
    assert (
        options["ray_actor_options"]["num_cpus"] == 1
        and "num_gpus" not in options["ray_actor_options"]
    )


def test_a_replica_asks_for_one_gpu_per_rank_of_its_engines_on_cuda() -> None:
    config = resolve(overrides={"num_replicas": 2}, platform="cuda", env={})
    options = deployment_options([config, config], {"num_cpus": 4})
    assert (
        options["ray_actor_options"]["num_gpus"] == 4
        and options["ray_actor_options"]["num_cpus"] == 4
    )


def test_serve_run_arguments_are_text_and_every_other_key_is_config(
    tiny_flux_dir: Path,
) -> None:
    spec, actor_options = spec_from_args(
        {
            "model": str(tiny_flux_dir),
            "served_model_name": "flux",
            "enforce_eager": "true",
            "autoscaling_max_replicas": "3",
            "image_url_ttl": "30",
            "ray_actor_options": json.dumps({"num_cpus": 2}),
            "stage_overrides": '{"0": {"max_batch_size": 2}}',
            "platform": "cpu",
        }
    )
    (model,) = spec.models
    assert (
        model.name == "flux"
        and spec.image_ttl_s == 30.0
        and actor_options == {"num_cpus": 2}
    )
    assert (
        model.config.stages[0].enforce_eager is True
        and model.config.stages[0].max_batch_size == 2
    )
    assert model.config.server.autoscaling.max_replicas == 3
    assert model.config.source_of("server.autoscaling.max_replicas").layer == "cli"


@pytest.mark.parametrize(
    "args, needle",
    [
        ({"autoscaling_max_replica": "2"}, "autoscaling_max_replica"),
        ({"ray_actor_options": "{not json"}, "not valid JSON"),
        ({"ray_actor_options": "[1]"}, "must be a mapping"),
        ({"model": 3}, "model must be a path"),
    ],
)
def test_bad_builder_arguments_are_config_errors(
    tiny_flux_dir: Path, args: dict, needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        spec_from_args({"model": str(tiny_flux_dir), "platform": "cpu", **args})


def test_models_are_one_a_list_or_comma_separated() -> None:
    assert (
        model_list(None) == []
        and model_list("a") == ["a"]
        and model_list("a, b") == ["a", "b"]
    )
    assert model_list(["x", "y"]) == ["x", "y"]


def test_autoscaling_without_ray_serve_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from diffserve.entrypoints.commands.serve import _warn_unused_autoscaling

    with caplog.at_level(logging.WARNING, logger="diffserve"):
        _warn_unused_autoscaling(resolve(platform="cpu", env={}))
        assert not caplog.records
        _warn_unused_autoscaling(
            resolve(overrides={"autoscaling_max_replicas": 2}, platform="cpu", env={})
        )
    (record,) = caplog.records
    assert (
        "server.autoscaling.max_replicas" in record.getMessage()
        and "--ray-serve" in record.getMessage()
    )


def test_a_replica_traces_as_the_front_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tracing x Ray Serve: a replica's process gets the front's OTEL_* settings (and
    # only those), so its spans go where the front's go.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("DIFFSERVE_TRACE_STEPS", "1")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    env = deployment_options([resolve(overrides=SCALING, platform="cpu", env={})])[
        "ray_actor_options"
    ]["runtime_env"]["env_vars"]
    assert (
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
        and env["DIFFSERVE_TRACE_STEPS"] == "1"
    )
    assert "UNRELATED_SECRET" not in env and env["RAY_worker_niceness"] == "0"
