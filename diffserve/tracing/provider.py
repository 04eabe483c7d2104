"""The process's tracer provider: started from the environment, flushed and stopped at
shutdown.

Each process that makes spans exports them itself: the server, and every mp worker and
Ray actor (they inherit the ``OTEL_*`` environment: ``executor/mp.py`` passes the
engine's, ``executor/ray.py`` puts it in the actors' runtime env). A
``BatchSpanProcessor`` sends them in the background; ``stop_tracing`` flushes what is
left, so a span a worker ended reaches the collector before the worker exits.

The provider is diffserve's own, not installed as OpenTelemetry's global one: a web
framework with telemetry of its own (recent FastAPI makes a server span whenever a
global provider is set) would otherwise add a second HTTP span beside ``asgi.py``'s. An
application that wants its own instrumentation sets up its own provider.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from diffserve import __version__
from diffserve.logging import get_logger, set_line_context
from diffserve.tracing import switch
from diffserve.tracing.log_context import trace_ids
from diffserve.tracing.settings import (
    DEFAULT_SERVICE_NAME,
    TracingSettings,
    tracing_settings,
)

logger = get_logger(__name__)

_lock = threading.Lock()
_provider: Any = None  # opentelemetry.sdk.trace.TracerProvider while tracing is on
_tracer: Any = None
# a collector that does not answer must not hold a process's exit longer than this
_STOP_S = 5.0


def start_tracing(role: str, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on in this process when ``environ`` (default: ``os.environ``) asks
    for it; True when on.

    ``role`` (``server``, ``worker``) becomes the resource attribute
    ``diffserve.process.role``. Idempotent: a second call keeps the first provider.
    Without the SDK installed it warns and stays off."""
    global _provider, _tracer
    settings = tracing_settings(os.environ if environ is None else environ)
    with _lock:
        if _provider is not None:
            return True
        if not settings.enabled:
            if settings.unknown_exporters:
                logger.warning(
                    "tracing off: %s (asked for %s)",
                    settings.reason,
                    ", ".join(settings.unknown_exporters),
                )
            return False
        try:
            provider = _build_provider(role, settings)
        except ImportError as exc:
            logger.warning(
                "tracing asked for by the OTEL_* environment, but %s: "
                "install diffserve[otel] "
                "(opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http); "
                "tracing stays off",
                exc,
            )
            return False
        _provider, _tracer = provider, provider.get_tracer("diffserve", __version__)
        switch.STEP_SPANS = settings.step_spans
        switch.ON = True
    set_line_context(trace_ids)
    if settings.unknown_exporters:
        logger.warning(
            "tracing: ignoring unknown OTEL_TRACES_EXPORTER entries %s",
            list(settings.unknown_exporters),
        )
    logger.info(
        "tracing on (%s): service %s, exporters %s, pid %d",
        role,
        provider.resource.attributes.get("service.name"),
        ",".join(settings.exporters),
        os.getpid(),
    )
    return True


def tracer() -> Any:
    """The diffserve tracer (called once ``switch.ON`` was seen true; a no-op one if
    tracing stopped since)."""
    current = _tracer
    if current is None:
        from opentelemetry.trace import NoOpTracer

        return NoOpTracer()
    return current


def flush_tracing() -> None:
    """Export every ended span now (bounded by ``_STOP_S``); nothing when tracing is
    off."""
    provider = _provider
    if provider is not None:
        _bounded(provider.force_flush, "flush")


def stop_tracing() -> None:
    """Flush and shut the provider down (bounded), and turn the flag off. Nothing when
    tracing is off."""
    global _provider, _tracer
    with _lock:
        provider, _provider = _provider, None
        if provider is None:
            return
        switch.ON = False
        _tracer = None
    set_line_context(None)
    _bounded(provider.shutdown, "shutdown")


def _build_provider(role: str, settings: TracingSettings) -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # ImportError before anything is built.
    exporters = [_exporter(name) for name in settings.exporters]
    # The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; only when neither
    # names the service is it diffserve (rather than the SDK's
    # "unknown_service:python").
    resource = Resource.create(
        {"process.pid": os.getpid(), "diffserve.process.role": role}
    )
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    if protocol and protocol != "http/protobuf":
        logger.warning(
            "tracing: OTLP protocol %r is not supported; diffserve "
            "exports OTLP over http/protobuf "
            "(port 4318 on a collector)",
            protocol,
        )
    # Endpoint, headers, timeout and compression come from the OTEL_EXPORTER_OTLP_*
    # variables.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _bounded(call: Any, what: str) -> None:
    """``call()`` on a daemon thread, waited for at most ``_STOP_S``: an exporter
    retrying against an absent collector must not keep a worker from exiting (its parent
    SIGKILLs it after a grace period anyway)."""
    thread = threading.Thread(
        target=call, name=f"diffserve-tracing-{what}", daemon=True
    )
    thread.start()
    thread.join(_STOP_S)
    if thread.is_alive():
        logger.warning(
            "tracing: %s did not finish within %.0f s (is the collector reachable?)",
            what,
            _STOP_S,
        )
