"""``server.autoscaling``: a section nested in ``server``, read from YAML, flags and the
environment like every key, its cross-key rules reported with the key path, the line and
the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from config_helpers import line_of, run, write

from diffserve.config.explain import explain_dict
from diffserve.config.json_schema import deploy_json_schema
from diffserve.errors import ConfigError, ConfigErrors


def test_nested_yaml_keys_resolve_with_their_lines(tmp_path: Path) -> None:
    deploy = write(
        tmp_path / "d.yaml",
        """
        server:
          max_queue: 8
          autoscaling:
            min_replicas: 2
            max_replicas: 5
            target_ongoing_requests: 3
            downscale_delay_s: 60
        """,
    )
    config = run(deploy_config=deploy)
    scaling = config.server.autoscaling
    assert (
        scaling.min_replicas,
        scaling.max_replicas,
        scaling.target_ongoing_requests,
    ) == (2, 5, 3)
    assert (
        scaling.downscale_delay_s == 60.0
        and scaling.upscale_delay_s == 30.0
        and config.server.max_queue == 8
    )
    assert config.source_of("server.autoscaling.max_replicas").line == line_of(
        deploy, "max_replicas"
    )
    assert config.source_of("server.autoscaling.upscale_delay_s").layer == "default"
    pipeline = explain_dict(config)["pipeline"]
    assert pipeline["server.autoscaling.min_replicas"]["value"] == 2


def test_flags_and_environment_use_the_flat_names(tmp_path: Path) -> None:
    config = run(
        overrides={"autoscaling_max_replicas": "4"},
        env={"DIFFSERVE_AUTOSCALING_MIN_REPLICAS": "2"},
    )
    assert (
        config.server.autoscaling.min_replicas,
        config.server.autoscaling.max_replicas,
    ) == (2, 4)
    assert config.source_of("server.autoscaling.min_replicas").layer == "env"
    # A caller may also give the nested mapping.
    nested = run(overrides={"server": {"autoscaling": {"max_replicas": 3}}})
    assert nested.server.autoscaling.max_replicas == 3
    assert nested.fingerprint != run().fingerprint


def test_min_above_max_names_the_written_key_its_line_and_the_fix(
    tmp_path: Path,
) -> None:
    deploy = write(
        tmp_path / "d.yaml",
        "server:\n  autoscaling:\n    min_replicas: 3\n    max_replicas: 2\n",
    )
    with pytest.raises(ConfigError) as info:
        run(deploy_config=deploy)
    error = info.value
    assert error.path == "server.autoscaling.max_replicas"
    assert error.source == f"{deploy.resolve()}:4"
    assert "min_replicas 3 is above max_replicas 2" in error.rule and "at least 3" in (
        error.hint or ""
    )
    # With max_replicas left at its default, the written min_replicas is the line named.
    with pytest.raises(ConfigError) as only_min:
        run(overrides={"autoscaling_min_replicas": 2})
    assert only_min.value.path == "server.autoscaling.min_replicas" and "cli" in (
        only_min.value.source or ""
    )


def test_a_look_back_window_of_one_report_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        run(
            overrides={
                "autoscaling_metrics_interval_s": 5,
                "autoscaling_look_back_period_s": 5,
            }
        )
    assert (
        info.value.path == "server.autoscaling.look_back_period_s"
        and "single report" in info.value.rule
    )


@pytest.mark.parametrize(
    "text, path, needle",
    [
        (
            "server: {autoscaling: {max_replica: 2}}\n",
            "server.autoscaling.max_replica",
            "did you mean 'max_replicas'",
        ),
        ("server: {autoscaling: 2}\n", "server.autoscaling", "expected a mapping"),
        (
            "server: {autoscaling: {min_replicas: 0}}\n",
            "server.autoscaling.min_replicas",
            "below the minimum 1",
        ),
        (
            "server: {autoscaling: {target_ongoing_requests: true}}\n",
            "server.autoscaling.target_ongoing_requests",
            "not an integer",
        ),
        (
            "autoscaling_max_replicas: 2\n",
            "autoscaling_max_replicas",
            "server: {autoscaling: {max_replicas: ...}}",
        ),
    ],
)
def test_bad_values_and_keys_name_their_path(
    tmp_path: Path, text: str, path: str, needle: str
) -> None:
    deploy = write(tmp_path / "d.yaml", text)
    with pytest.raises(ConfigError) as info:
        run(deploy_config=deploy)
    errors = info.value.errors if isinstance(info.value, ConfigErrors) else [info.value]
    assert any(error.path == path and needle in str(error) for error in errors), [
        str(e) for e in errors
    ]


def test_json_schema_nests_the_section() -> None:
    server = deploy_json_schema()["properties"]["server"]
    section = server["properties"]["autoscaling"]
    assert section["additionalProperties"] is False
    assert section["properties"]["max_replicas"] == {
        **section["properties"]["max_replicas"],
        "default": 1,
        "type": "integer",
        "minimum": 1,
    }
    assert not any("." in key for key in server["properties"])
