"""Spans of the server and engine side, and the carrier that takes a request's trace to
its workers.

Every function returns at once (or returns a shared null context) while ``switch.ON`` is
false.

The carrier: ``carry(request)`` writes the current context (the HTTP span, while
``EngineCore.submit`` runs in the request's task) into
``GenerationRequest.trace_context`` as W3C ``traceparent``/``tracestate`` pairs; the
request is pickled to mp workers and Ray actors with it, and ``batch.py`` parents the
worker's spans on it.

The engine's own threads (a replica's dispatch loop, a stage's) make the carried context
current around a batch's work (``current``), so the lines they log about it carry the
request's trace (``log_context.py``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from diffserve.tracing import provider, switch
from diffserve.tracing.attributes import BATCH_SIZE, REQUEST_ID

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.types.request import GenerationRequest

_OFF: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()


def span(
    name: str, attributes: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """``with span(name, attributes):`` a child of the current span, current inside the
    block (an exception is recorded on it and sets its status to error); the span
    object, or None when tracing is off."""
    if not switch.ON:
        return _OFF
    return provider.tracer().start_as_current_span(
        name, attributes=dict(attributes or {})
    )


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set ``attributes`` on the current span (e.g. the model a handler picked, on the
    HTTP span)."""
    if not switch.ON:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(dict(attributes))


def carry(request: GenerationRequest) -> GenerationRequest:
    """``request`` with the current trace context as its carrier (unchanged when off or
    outside a span)."""
    if not switch.ON:
        return request
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return (
        request.carrying(trace_context=tuple(sorted(carrier.items())))
        if carrier
        else request
    )


def parent_of(carrier: Sequence[tuple[str, str]]) -> Any:
    """The context a carrier names, or None when it names no sampled span (nothing of it
    is then traced)."""
    context = carried(carrier)
    if context is None:
        return None
    from opentelemetry import trace

    return (
        context
        if trace.get_current_span(context).get_span_context().trace_flags.sampled
        else None
    )


def carried(carrier: Sequence[tuple[str, str]]) -> Any:
    """The context a carrier names, sampled or not (a dropped trace still has ids for
    log lines), or None."""
    if not carrier:
        return None
    from opentelemetry import propagate, trace

    context = propagate.extract(dict(carrier))
    return (
        context if trace.get_current_span(context).get_span_context().is_valid else None
    )


def current(
    requests: Sequence[GenerationRequest],
) -> contextlib.AbstractContextManager[Any]:
    """``with current(requests):`` the first request's carried context (its HTTP span)
    is current in this thread, so what an engine thread logs about a batch carries that
    request's trace and span ids; one line has room for one trace, so the batch's other
    requests are not named by it. A null context when off."""
    if not switch.ON:
        return _OFF
    for request in requests:
        context = carried(request.carried.trace_context)
        if context is not None:
            return _attached(context)
    return _OFF


@contextlib.contextmanager
def _attached(context: Any) -> Iterator[None]:
    """``context`` (an opentelemetry Context) current inside the block, the previous one
    again after it."""
    from opentelemetry import context as otel_context

    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def wall_ns(monotonic_s: float) -> int:
    """A ``time.monotonic()`` instant as the wall-clock nanoseconds spans use."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


class Queued(Protocol):
    """What a queue wait is read from (``engine/scheduler.py:RequestState``)."""

    request: GenerationRequest
    arrival: float
    started: float | None


def queue_waited(batch: Sequence[Queued]) -> None:
    """A ``diffserve.queue_wait`` span per traced request of ``batch``, from its arrival
    to now (it just left the queue)."""
    if not switch.ON:
        return
    end = time.time_ns()
    for state in batch:
        parent = parent_of(state.request.carried.trace_context)
        if parent is None:
            continue
        start = wall_ns(state.arrival)
        queued = provider.tracer().start_span(
            "diffserve.queue_wait",
            context=parent,
            start_time=min(start, end),
            attributes={REQUEST_ID: state.request.request_id, BATCH_SIZE: len(batch)},
        )
        queued.end(end_time=end)
