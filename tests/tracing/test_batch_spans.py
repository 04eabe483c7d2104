"""Tracing on, in process, exporting to a local OTLP/HTTP receiver: the carrier, a
worker's batch spans (stages, step events or step spans, cancel, error), the queue wait,
and trace ids in log lines. No model: the batch trace is driven the way the worker's
command loop drives it (``worker/loop.py``)."""

from __future__ import annotations

import io
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from otlp_receiver import OtlpReceiver, ReceivedSpan

from diffserve.executor.calls import CallTable
from diffserve.logging import _FORMAT, _Formatter
from diffserve.tracing import switch
from diffserve.tracing.batch import batch_trace
from diffserve.tracing.provider import start_tracing, stop_tracing
from diffserve.tracing.spans import carry, current, queue_waited, span
from diffserve.types.messages import Reply
from diffserve.types.request import GenerationRequest
from diffserve.types.results import RequestResult

WORKER = {"diffserve.executor": "uni", "diffserve.rank": 0, "diffserve.world_size": 1}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        monkeypatch.delenv("DIFFSERVE_TRACE_STEPS", raising=False)
        yield receiver
        # also when a test failed half way: the flag never stays on for the next test
        stop_tracing()


def traced(request_id: str, steps: int = 2) -> GenerationRequest:
    """A request as admission hands it on: with the current span's context as its
    carrier."""
    return carry(
        GenerationRequest(
            prompt="p", seed=1, num_inference_steps=steps, request_id=request_id
        )
    )


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def run_batch(
    requests: list[GenerationRequest], steps: int, *, finish: bool = True
) -> None:
    trace = batch_trace(requests, lambda: dict(WORKER))
    with trace:
        time.sleep(0.002)
        for step in range(1, steps + 1):
            trace.step(step, steps, tuple((r.request_id, step) for r in requests))
        if finish:
            trace.finish(
                [
                    RequestResult(
                        r.request_id,
                        images=None,
                        seeds=[1],
                        timings_ms={"encode": 1.0, "denoise": 2.0, "decode": 0.5},
                        attestation={
                            "linear": {"torch": 8, "unused": 0},
                            "attention": {"sdpa": 4},
                            "cache": [
                                {"computed_steps": 2, "skipped_steps": 1, "trace": []}
                            ],
                            "conditioning_cache": "hit",
                            "batch_size": len(requests),
                        },
                    )
                    for r in requests
                ]
            )


def test_a_batch_of_two_requests_makes_a_span_tree_in_each_trace(
    receiver: OtlpReceiver,
) -> None:
    assert start_tracing("worker") and switch.ON
    with span("client a") as a:
        first = traced("a", steps=3)
    with span("client b"):
        second = traced("b", steps=3)
    # E.g. warmup: no carrier, no spans.
    untraced = GenerationRequest(prompt="p", seed=1, request_id="c")
    run_batch([first, second, untraced], steps=3)
    stop_tracing()
    spans = receiver.spans()

    executes = named(spans, "diffserve.execute")
    assert sorted(s.attributes["diffserve.request_id"] for s in executes) == ["a", "b"]
    execute = next(s for s in executes if s.attributes["diffserve.request_id"] == "a")
    assert execute.trace_id == f"{a.get_span_context().trace_id:032x}"
    assert execute.parent_span_id == f"{a.get_span_context().span_id:016x}"
    # Backends that ran, not zero counts.
    assert execute.attributes["diffserve.kernel.linear"] == ["torch"]
    assert execute.attributes["diffserve.kernel.attention"] == ["sdpa"]
    assert execute.attributes["diffserve.cache.computed_steps"] == 2
    assert execute.attributes["diffserve.cache.skipped_steps"] == 1
    assert execute.attributes["diffserve.conditioning_cache"] == "hit"
    assert (
        execute.attributes["diffserve.batch.size"] == 3
        and execute.attributes["diffserve.executor"] == "uni"
    )
    children = [s for s in spans if s.parent_span_id == execute.span_id]
    assert sorted(s.name for s in children) == [
        "diffserve.decode",
        "diffserve.denoise",
        "diffserve.encode",
    ]
    denoise = next(s for s in children if s.name == "diffserve.denoise")
    assert [e[1]["diffserve.step"] for e in denoise.events] == [1, 2, 3]
    assert {s.trace_id for s in spans if s.name.startswith("diffserve.")} == {
        f"{a.get_span_context().trace_id:032x}",
        next(s.trace_id for s in executes if s is not execute),
    }


def test_step_spans_cancel_and_error(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DIFFSERVE_TRACE_STEPS", "1")
    assert start_tracing("worker") and switch.STEP_SPANS
    with span("client"):
        done, cancelled, failed = (
            traced("done"),
            traced("cancelled", steps=4),
            traced("failed"),
        )
    run_batch([done], steps=2)
    # The batch stopped after one step: no results.
    run_batch([cancelled], steps=1, finish=False)
    with pytest.raises(RuntimeError):
        trace = batch_trace([failed], lambda: dict(WORKER))
        with trace:
            raise RuntimeError("the pipeline broke")
    stop_tracing()
    spans = receiver.spans()

    by_request = {
        s.attributes["diffserve.request_id"]: s
        for s in named(spans, "diffserve.execute")
    }
    denoise = next(
        s
        for s in spans
        if s.name == "diffserve.denoise"
        and s.parent_span_id == by_request["done"].span_id
    )
    step_spans = [s for s in spans if s.parent_span_id == denoise.span_id]
    assert [s.attributes["diffserve.step"] for s in step_spans] == [
        1,
        2,
    ] and not denoise.events
    assert all(
        s.name == "diffserve.step" and s.start_ns <= s.end_ns for s in step_spans
    )
    assert by_request["cancelled"].attributes["diffserve.cancelled"] is True
    assert by_request["failed"].status_code == 2  # STATUS_CODE_ERROR
    assert "diffserve.cancelled" not in by_request["done"].attributes


def test_queue_wait_and_log_lines_carry_the_trace(receiver: OtlpReceiver) -> None:
    assert start_tracing("server")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Formatter(_FORMAT))
    log = logging.getLogger("diffserve.tests.tracing")
    log.addHandler(handler)
    try:
        with span("HTTP") as http:
            request = traced("q")
            log.warning("inside")
        log.warning("outside")
    finally:
        log.removeHandler(handler)

    class State:
        arrival, started = time.monotonic() - 0.25, time.monotonic()

    state = State()
    state.request = request  # type: ignore[attr-defined]
    queue_waited([state])  # type: ignore[list-item]
    stop_tracing()

    context = http.get_span_context()
    inside, outside = stream.getvalue().splitlines()
    assert inside.endswith(
        f"inside trace_id={context.trace_id:032x} span_id={context.span_id:016x}"
    )
    assert outside.endswith("outside")
    (wait,) = named(receiver.spans(), "diffserve.queue_wait")
    assert (
        wait.parent_span_id == f"{context.span_id:016x}"
        and wait.attributes["diffserve.request_id"] == "q"
    )
    assert 0.2e9 < wait.end_ns - wait.start_ns < 5e9


def test_lines_logged_off_the_request_task_carry_its_trace(
    receiver: OtlpReceiver,
) -> None:
    """The engine's dispatch thread (``current``), the executor's reader thread running
    a step callback, and a worker's batch none of whose requests the sampler kept: each
    logs lines naming the request's trace."""
    assert start_tracing("server")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(_Formatter(_FORMAT))
    log = logging.getLogger("diffserve.tests.tracing")
    log.addHandler(handler)
    with span("HTTP") as http:
        request = traced("r")
    # a client trace the sampler dropped
    parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"
    dropped = replace(request, request_id="d").carrying(
        trace_context=(("traceparent", parent),)
    )
    calls = CallTable()

    def engine_thread() -> (
        None
    ):  # as EngineCore._loop: the batch's context current around its run
        with current(
            [GenerationRequest(prompt="p", seed=1, request_id="warmup"), request]
        ):
            log.warning("engine")
            call = calls.open(1, on_step=lambda step, *_: log.warning("step %d", step))
        reader = threading.Thread(
            target=calls.deliver,
            args=(Reply("step", call.call_id, 0, step=1, total_steps=1),),
        )
        reader.start()
        reader.join()
        with batch_trace([dropped], lambda: dict(WORKER)):
            log.warning("worker")

    try:
        thread = threading.Thread(target=engine_thread)
        thread.start()
        thread.join()
    finally:
        log.removeHandler(handler)
    stop_tracing()

    context = http.get_span_context()
    ours = f"trace_id={context.trace_id:032x} span_id={context.span_id:016x}"
    engine, step, worker = stream.getvalue().splitlines()
    assert engine.endswith(f"engine {ours}") and step.endswith(f"step 1 {ours}")
    assert worker.endswith(f"worker trace_id={parent[3:35]} span_id={parent[36:52]}")
    # Dropped: ids in lines, but no spans.
    assert named(receiver.spans(), "diffserve.execute") == []
