"""The worker's spans of one batch, made in the worker's own process (mp worker, Ray
actor) or thread (uni).

A batch of several requests makes one ``diffserve.execute`` span per traced request,
each in its own request's trace (parented on the request's carrier,
``GenerationRequest.trace_context``), with the batch size as an attribute; the step
events are repeated on each. Every rank of a multi-rank layout makes its own (``rank``).

Under each ``diffserve.execute``: ``diffserve.encode``, ``diffserve.denoise`` and
``diffserve.decode``, placed from the pipeline's own phase timings
(``RequestResult.timings_ms``, so every pipeline gets them, staged ones the phases they
run) and the instants the step events arrived: encode from the request's start, denoise
up to its last step, decode after it. ``diffserve.denoise`` has one ``diffserve.step``
event per denoise step, or, with ``DIFFSERVE_TRACE_STEPS=1``, one ``diffserve.step``
child span per step.

While the batch runs, the first traced request's ``diffserve.execute`` span is current,
so the worker's log lines carry its trace and span ids; when no request of it is
sampled, the first one's carried context is (the trace the sampler dropped still names
the lines).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from diffserve.tracing import provider, switch
from diffserve.tracing.attributes import (
    BATCH_SIZE,
    CANCELLED,
    STEP,
    STEPS,
    attestation_attributes,
    request_attributes,
)
from diffserve.tracing.spans import carried, parent_of

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.types.request import GenerationRequest
    from diffserve.types.results import RequestResult

# The worker's own attributes, asked for once per traced batch.
Describe = Callable[[], dict[str, Any]]


class _Traced:
    """One request's open ``diffserve.execute`` span and the instants of its steps."""

    def __init__(self, span: Any, start_ns: int) -> None:
        self.span = span
        self.start_ns = start_ns
        # (step, total steps, wall ns when it was reported)
        self.steps: list[tuple[int, int, int]] = []


class BatchTrace:
    """``with trace:`` around a batch's run; ``step`` per step event, ``join`` for
    requests that join it, ``finish`` for results (before they are sent). Spans still
    open at the end are ended as cancelled, or with the error that ended the batch."""

    def __init__(self, batch: Sequence[GenerationRequest], describe: Describe) -> None:
        self._describe = describe
        self._worker: dict[str, Any] | None = None
        self._open: dict[str, _Traced] = {}
        self._token: Any = None
        # requests the batch has run so far (traced or not); the attestation's, once
        # known
        self._size = 0
        self._batch = batch
        self.join(batch)

    def join(self, requests: Sequence[GenerationRequest]) -> None:
        """Start the spans of ``requests`` (the batch, or requests joining it at a step
        boundary)."""
        self._size += len(requests)
        now = time.time_ns()
        for request in requests:
            parent = parent_of(request.carried.trace_context)
            if parent is None:
                continue
            if self._worker is None:
                self._worker = self._describe()
            span = provider.tracer().start_span(
                "diffserve.execute",
                context=parent,
                start_time=now,
                attributes={
                    **self._worker,
                    **request_attributes(request),
                    BATCH_SIZE: self._size,
                },
            )
            self._open[request.request_id] = _Traced(span, now)

    def step(
        self, step: int, total: int, progress: tuple[tuple[str, int], ...] = ()
    ) -> None:
        """A step event: every open request advanced (``progress``: each request's own
        step, when given)."""
        now = time.time_ns()
        steps = dict(progress)
        for request_id, traced in self._open.items():
            if not steps:
                traced.steps.append((step, total, now))
            elif request_id in steps:
                traced.steps.append((steps[request_id], total, now))

    def finish(
        self, outputs: Sequence[RequestResult] | None
    ) -> Sequence[RequestResult] | None:
        """End the spans of the requests in ``outputs``, their stage spans and
        attributes made; returns them."""
        now = time.time_ns()
        for output in outputs or ():
            traced = self._open.pop(output.request_id, None)
            if traced is not None:
                _stages(traced, output.timings_ms, now)
                traced.span.set_attributes(attestation_attributes(output.attestation))
                traced.span.end(end_time=now)
        return outputs

    def __enter__(self) -> BatchTrace:
        from opentelemetry import context, trace

        if self._open:
            first = next(iter(self._open.values()))
            self._token = context.attach(trace.set_span_in_context(first.span))
            return self
        # Nothing sampled: the log lines still name the first request's trace.
        for request in self._batch:
            carrier = carried(request.carried.trace_context)
            if carrier is not None:
                self._token = context.attach(carrier)
                break
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._token is not None:
            from opentelemetry import context

            context.detach(self._token)
            self._token = None
        if not self._open:
            return
        from opentelemetry.trace import Status, StatusCode

        now = time.time_ns()
        for traced in self._open.values():
            if traced.steps:  # how far it got
                _denoise(traced, traced.start_ns, traced.steps[-1][2])
            if error is not None:
                traced.span.record_exception(error)
                traced.span.set_status(
                    Status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
                )
            else:
                traced.span.set_attribute(CANCELLED, True)
            traced.span.end(end_time=now)
        self._open.clear()


class _Untraced:
    """The batch trace while tracing is off, or when no request of the batch is traced:
    every call a no-op."""

    def join(self, requests: Sequence[GenerationRequest]) -> None:
        pass

    def step(
        self, step: int, total: int, progress: tuple[tuple[str, int], ...] = ()
    ) -> None:
        pass

    def finish(
        self, outputs: Sequence[RequestResult] | None
    ) -> Sequence[RequestResult] | None:
        return outputs

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


UNTRACED = _Untraced()


def batch_trace(
    batch: Sequence[GenerationRequest], describe: Describe
) -> BatchTrace | _Untraced:
    """The trace of one batch: ``UNTRACED`` (shared, does nothing) unless tracing is on
    in this process."""
    if not switch.ON:
        return UNTRACED
    return BatchTrace(batch, describe)


def _stages(traced: _Traced, timings_ms: dict[str, float], end_ns: int) -> None:
    """``diffserve.encode``/``denoise``/``decode`` under the request's span, for the
    phases its pipeline timed."""
    start = traced.start_ns
    encode_end = min(end_ns, start + _ns(timings_ms.get("encode", 0.0)))
    if "encode" in timings_ms:
        _child("diffserve.encode", traced.span, start, encode_end).end(
            end_time=encode_end
        )
    decode_ms = timings_ms.get("decode")
    last_step = traced.steps[-1][2] if traced.steps else None
    if "denoise" in timings_ms or traced.steps:
        denoise_end = (
            last_step
            if last_step is not None
            else max(encode_end, end_ns - _ns(decode_ms or 0.0))
        )
        _denoise(traced, encode_end, max(encode_end, denoise_end))
    if decode_ms is not None:
        # Decoding follows the last step (it is what the pipeline does next); without
        # steps it ends the run.
        decode_start = (
            last_step if last_step is not None else max(start, end_ns - _ns(decode_ms))
        )
        decode_end = min(end_ns, max(decode_start, decode_start + _ns(decode_ms)))
        _child("diffserve.decode", traced.span, decode_start, decode_end).end(
            end_time=decode_end
        )


def _denoise(traced: _Traced, start_ns: int, end_ns: int) -> None:
    """``diffserve.denoise`` under the request's span, with its steps' events or
    spans."""
    denoise = _child("diffserve.denoise", traced.span, start_ns, end_ns)
    _step_marks(denoise, traced, start_ns)
    denoise.end(end_time=end_ns)


def _step_marks(denoise: Any, traced: _Traced, start_ns: int) -> None:
    """One ``diffserve.step`` event per step on ``denoise``, or a child span per step
    (``DIFFSERVE_TRACE_STEPS=1``)."""
    previous = start_ns
    for step, total, at in traced.steps:
        attributes = {STEP: step, STEPS: total}
        if switch.STEP_SPANS:
            _child("diffserve.step", denoise, min(previous, at), at, attributes).end(
                end_time=at
            )
        else:
            denoise.add_event("diffserve.step", attributes, timestamp=at)
        previous = at


def _child(
    name: str,
    parent: Any,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, Any] | None = None,
) -> Any:
    from opentelemetry import trace

    return provider.tracer().start_span(
        name,
        context=trace.set_span_in_context(parent),
        start_time=min(start_ns, end_ns),
        attributes=attributes,
    )


def _ns(milliseconds: float) -> int:
    return int(float(milliseconds) * 1e6)
