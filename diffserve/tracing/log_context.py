"""Trace and span ids in log lines: the text ``provider.start_tracing`` installs as the logging line context
(``diffserve/logging.py:set_line_context``), so a line logged while a request's span is current says which
trace it belongs to. Nothing is installed while tracing is off: the line format is then unchanged."""

from __future__ import annotations


def trace_ids() -> str:
    """`` trace_id=<32 hex> span_id=<16 hex>`` of the current span, or ``""`` when none is current."""
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return ""
    return f" trace_id={context.trace_id:032x} span_id={context.span_id:016x}"
