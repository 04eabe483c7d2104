"""Trace and span ids in log lines: the text ``provider.start_tracing`` installs as the
logging line context (``diffserve/logging.py:set_line_context``), so a line logged while
a request's span is current says which trace it belongs to. Nothing is installed while
tracing is off: the line format is then unchanged.

It reads the logging thread's current context, so every thread that works on a request
makes the request's context current: the request's task (``asgi.py``: the HTTP span),
the engine's dispatch and stage loops (``spans.py:current``: the carried context), the
executor's reader thread (its call's context, copied when the batch was sent:
``executor/calls.py``) and the worker (``batch.py``: the ``diffserve.execute`` span)."""

from __future__ import annotations


def trace_ids() -> str:
    """`` trace_id=<32 hex> span_id=<16 hex>`` of the current span, or ``""`` when none
    is current."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f" trace_id={context.trace_id:032x} span_id={context.span_id:016x}"
