"""Tracing off (no OTEL_* asking for it): every hook is the flag check and nothing else.
Run in a fresh interpreter so that "nothing else" is observable: after every hook ran,
opentelemetry was never even imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

OFF_PATH = textwrap.dedent("""
    import asyncio, io, logging, sys

    from diffserve.logging import _FORMAT, _Formatter
    from diffserve.tracing import switch
    from diffserve.tracing.asgi import TracingMiddleware
    from diffserve.tracing.batch import UNTRACED, batch_trace
    from diffserve.tracing.provider import flush_tracing, start_tracing, stop_tracing
    from diffserve.tracing.spans import annotate, carry, current, queue_waited, span
    from diffserve.types.request import GenerationRequest

    disabled = {"OTEL_SERVICE_NAME": "x", "OTEL_SDK_DISABLED": "true",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert start_tracing("server", environ=disabled) is False
    assert start_tracing("server", environ={}) is False and switch.ON is False
    request = GenerationRequest(prompt="p", seed=1)
    opened_null = span("x")
    with span("diffserve.admission", {"a": 1}) as opened:
        assert opened is None
        # One shared null context, nothing allocated per call:
        assert span("other") is span("another")
        annotate({"diffserve.model": "m"})
        assert carry(request) is request and request.carried.trace_context == ()
        # The engine threads' context: the same null context.
        assert current([request]) is opened_null

    class State:
        request, arrival, started = GenerationRequest(prompt="p", seed=1), 0.0, 1.0

    queue_waited([State()])
    trace = batch_trace([request], describe=lambda: 1 / 0)  # attributes: never asked
    assert trace is UNTRACED
    with trace:
        trace.join([request]); trace.step(1, 2); outputs = []
        assert trace.finish(outputs) is outputs
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    scope = {"type": "http", "path": "/x", "method": "GET", "headers": []}
    asyncio.run(TracingMiddleware(app)(scope, None, None))
    assert seen == ["/x"]
    flush_tracing(); stop_tracing()

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Formatter(_FORMAT))
    record = logging.LogRecord(
        "diffserve.x", logging.INFO, "x.py", 1, "hello %s", ("world",), None)
    line = handler.format(record)
    assert line == logging.Formatter(_FORMAT).format(record), line
    assert line.endswith("hello world"), line
    loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
    assert not loaded, loaded
    print("off path ok")
""")


def test_every_hook_is_a_no_op_and_opentelemetry_is_never_imported() -> None:
    result = subprocess.run(
        [sys.executable, "-c", OFF_PATH],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0 and "off path ok" in result.stdout, (
        result.stdout + result.stderr
    )
