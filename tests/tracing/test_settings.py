"""When the environment turns tracing on: the standard OTEL_* rules
(tracing/settings.py)."""

from __future__ import annotations

import pytest

from diffserve.tracing.settings import tracing_environment, tracing_settings


@pytest.mark.parametrize(
    "environ, exporters",
    [
        ({}, ()),
        (
            {"OTEL_SERVICE_NAME": "x", "OTEL_RESOURCE_ATTRIBUTES": "a=b"},
            (),
        ),  # naming a service is not asking
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, ()),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console, OTLP"}, ("console", "otlp")),
        (
            {
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            },
            (),
        ),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, ()),
        (
            {
                "OTEL_SDK_DISABLED": "true",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            },
            (),
        ),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "console"}, ()),
        (
            {
                "OTEL_SDK_DISABLED": "false",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            },
            ("otlp",),
        ),
    ],
)
def test_on_only_when_an_exporter_or_endpoint_is_named(
    environ: dict[str, str], exporters: tuple[str, ...]
) -> None:
    settings = tracing_settings(environ)
    assert settings.exporters == exporters and settings.enabled == bool(exporters)
    assert settings.enabled or settings.reason


def test_unknown_exporters_are_reported_and_step_spans_read() -> None:
    settings = tracing_settings(
        {"OTEL_TRACES_EXPORTER": "zipkin,otlp", "DIFFSERVE_TRACE_STEPS": "1"}
    )
    assert (
        settings.exporters == ("otlp",)
        and settings.unknown_exporters == ("zipkin",)
        and settings.step_spans
    )
    assert not tracing_settings({"DIFFSERVE_TRACE_STEPS": "0"}).step_spans


def test_the_environment_a_ray_actor_gets() -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_SERVICE_NAME": "s",
        "DIFFSERVE_TRACE_STEPS": "1",
        "PATH": "/bin",
        "DIFFSERVE_LOG_LEVEL": "DEBUG",
    }
    assert tracing_environment(environ) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "OTEL_SERVICE_NAME": "s",
        "DIFFSERVE_TRACE_STEPS": "1",
    }


def test_diffserve_trace_steps_is_not_a_config_variable() -> None:
    """The resolver refuses unknown DIFFSERVE_* variables close to a key; this one is
    tracing's, not config."""
    from diffserve.config.resolve import resolve

    resolve(model=None, env={"DIFFSERVE_TRACE_STEPS": "1"})
