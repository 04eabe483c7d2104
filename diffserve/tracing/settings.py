"""Whether this process traces, read from the standard OpenTelemetry environment
variables only.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is
set, or when ``OTEL_TRACES_EXPORTER`` names an exporter other than ``none``; off when
none of them is set, when ``OTEL_TRACES_EXPORTER`` is ``none``, and whenever
``OTEL_SDK_DISABLED=true``. Everything else the SDK reads itself (``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``,
``OTEL_EXPORTER_OTLP_HEADERS``/``TIMEOUT``/``COMPRESSION``...).
``DIFFSERVE_TRACE_STEPS=1`` is diffserve's own: a child span per denoise step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
EXPORTER_VAR = "OTEL_TRACES_EXPORTER"
DISABLED_VAR = "OTEL_SDK_DISABLED"
SERVICE_VAR = "OTEL_SERVICE_NAME"
STEPS_VAR = "DIFFSERVE_TRACE_STEPS"
DEFAULT_SERVICE_NAME = "diffserve"
# The exporters diffserve builds (the OTLP one over HTTP/protobuf: the diffserve[otel]
# extra).
KNOWN_EXPORTERS = ("otlp", "console")
_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class TracingSettings:
    """What the environment asks for: ``exporters`` empty means tracing is off
    (``reason`` says why)."""

    exporters: tuple[str, ...] = ()
    unknown_exporters: tuple[str, ...] = ()
    step_spans: bool = False
    reason: str = (
        "no OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT "
        "or OTEL_TRACES_EXPORTER set"
    )

    @property
    def enabled(self) -> bool:
        return bool(self.exporters)


def tracing_settings(environ: Mapping[str, str]) -> TracingSettings:
    """The tracing ``environ`` asks for (see the module doc for the rules)."""
    steps = environ.get(STEPS_VAR, "").strip().lower() in _TRUE
    if environ.get(DISABLED_VAR, "").strip().lower() == "true":
        return TracingSettings(step_spans=steps, reason=f"{DISABLED_VAR}=true")
    named = [
        name.strip().lower()
        for name in environ.get(EXPORTER_VAR, "").split(",")
        if name.strip()
    ]
    if named:
        wanted = [name for name in named if name != "none"]
        if not wanted:
            return TracingSettings(step_spans=steps, reason=f"{EXPORTER_VAR}=none")
        known = tuple(dict.fromkeys(name for name in wanted if name in KNOWN_EXPORTERS))
        unknown = tuple(
            dict.fromkeys(name for name in wanted if name not in KNOWN_EXPORTERS)
        )
        reason = (
            ""
            if known
            else f"{EXPORTER_VAR} names "
            "no exporter diffserve "
            f"has ({', '.join(KNOWN_EXPORTERS)})"
        )
        return TracingSettings(known, unknown, steps, reason)
    if any(environ.get(name, "").strip() for name in ENDPOINT_VARS):
        return TracingSettings(("otlp",), step_spans=steps, reason="")
    return TracingSettings(step_spans=steps)


def tracing_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables a process started elsewhere (a Ray actor on another node) needs to
    trace as this one does: every ``OTEL_*`` and ``DIFFSERVE_TRACE_STEPS``."""
    return {
        name: value
        for name, value in environ.items()
        if name.startswith("OTEL_") or name == STEPS_VAR
    }
