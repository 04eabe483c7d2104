"""Tracing on the ray executor: the actor gets the ``OTEL_*`` environment through its
runtime env (the session's Ray was started before the test set it, so nothing is
inherited), parents its spans on the request's carrier and exports them itself; the
batch span processor's delay is a minute, so they arrive through the actor's flush when
its command loop ends at shutdown."""

from __future__ import annotations

import os

import pytest
from otlp_receiver import OtlpReceiver

from diffserve.tracing.provider import start_tracing, stop_tracing
from diffserve.tracing.spans import span
from diffserve.types.request import GenerationRequest

pytestmark = pytest.mark.e2e


def test_ray_actor_exports_spans_of_the_request_trace(
    ray_session, tiny_flux_dir, monkeypatch
) -> None:
    from diffserve import Engine

    with OtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "diffserve-ray-test")
        assert start_tracing("server")
        try:
            with (
                Engine(
                    str(tiny_flux_dir),
                    distributed_executor_backend="ray",
                    enforce_eager=True,
                    dtype="float32",
                ) as engine,
                span("client") as client,
            ):
                output = engine.generate(
                    GenerationRequest(
                        prompt="p", height=64, width=64, num_inference_steps=2
                    )
                )
        finally:
            stop_tracing()
        spans = receiver.spans()

    trace_id = f"{client.get_span_context().trace_id:032x}"
    actor_pid = output.attestation["worker_pid"]
    assert output.attestation["executor"] == "ray" and actor_pid != os.getpid()
    (execute,) = [s for s in spans if s.name == "diffserve.execute"]
    assert (
        execute.trace_id == trace_id
        and execute.attributes["diffserve.executor"] == "ray"
    )
    assert (
        execute.resource["process.pid"] == actor_pid
        and execute.resource["diffserve.process.role"] == "worker"
    )
    assert execute.resource["service.name"] == "diffserve-ray-test"
    (denoise,) = [s for s in spans if s.name == "diffserve.denoise"]
    assert denoise.parent_span_id == execute.span_id and len(denoise.events) == 2
    (admission,) = [s for s in spans if s.name == "diffserve.admission"]
    assert (
        admission.resource["process.pid"] == os.getpid()
        and admission.trace_id == trace_id
    )
