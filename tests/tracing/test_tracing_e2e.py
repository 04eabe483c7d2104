"""Tracing through a real ``diffserve serve``: one request with a client ``traceparent``
on the mp executor is ONE trace, the client's, with the server's spans and the worker
process's own (exported by that process); every log line of the request names that trace
(mp: the worker process's lines too; uni: the worker thread's); with no ``OTEL_*`` in
the environment nothing reaches a receiver listening on the default OTLP port.

The batch span processor's delay is a minute, so every span arrives through the flush at
shutdown: the server's and the worker's (the worker process exits before the server
does)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from otlp_receiver import OtlpReceiver, ReceivedSpan
from server_process import ServerProcess

pytestmark = pytest.mark.e2e

STEPS = 3
SERVER_SPAN_KIND = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER
DEPLOY = (
    "distributed_executor_backend: {executor}\nenforce_eager: true\ndtype: float32\n"
)


@contextlib.contextmanager
def serving(
    model: Path,
    tmp_path: Path,
    executor: str,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[ServerProcess]:
    """A server whose environment has no OTEL_* but ``env``'s (the test run's own are
    dropped)."""
    for name in [
        name
        for name in os.environ
        if name.startswith("OTEL_") or name == "DIFFSERVE_TRACE_STEPS"
    ]:
        monkeypatch.delenv(name)
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(DEPLOY.format(executor=executor))
    server = ServerProcess(
        [
            str(model),
            "--deploy-config",
            str(deploy),
            "--served-model-name",
            "tiny-flux",
        ],
        tmp_path / "server.log",
        env=env,
    )
    try:
        server.wait_for("/ready")
        yield server
    finally:
        server.stop()


def generate(
    server: ServerProcess, headers: dict[str, str] | None = None, steps: int = STEPS
) -> dict:
    client = openai.OpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    # ``user`` reaches one debug log line of the request (images.py), logged while its
    # HTTP span is current.
    result = client.images.generate(
        model="tiny-flux",
        prompt="a red circle",
        size="64x64",
        user="tracer",
        extra_body={"num_inference_steps": steps},
        extra_headers=headers or {},
    )
    assert len(result.data) == 1
    return result.model_extra["diffserve"]


# One line of diffserve's log format (diffserve/logging.py), and the ids tracing ends it
# with.
LOG_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ (?P<logger>diffserve[\w.]*): "
    r"(?P<text>.*)$"
)
IDS = re.compile(r" trace_id=(?P<trace>[0-9a-f]{32}) span_id=(?P<span>[0-9a-f]{16})$")


def assert_request_lines_traced(
    log: str, request_id: str, trace_id: str, http: ReceivedSpan, execute: ReceivedSpan
) -> None:
    """The log-correlation rule, on a server's combined output (its worker processes
    write to the same stderr).

    The request is the only one in flight, so its lines are the diffserve lines from the
    first one that names its id (the HTTP handler's) to the last one that does (the
    engine's end of its batch): every one of them, and every line anywhere that names
    its id, must end with its trace id. Lines of the server side (HTTP handler,
    admission, the engine's dispatch thread) name the HTTP span, the worker's (thread or
    process) its ``diffserve.execute``. Other libraries' lines (their own handlers, e.g.
    ``[transformers] ...``) are not diffserve's and not checked; the request's prompt is
    short, so there are none."""
    lines = log.splitlines()
    naming = [i for i, line in enumerate(lines) if request_id in line]
    assert naming, log[-3000:]
    for i in naming:
        ids = IDS.search(lines[i])
        assert LOG_LINE.match(lines[i]) and ids and ids.group("trace") == trace_id, (
            lines[i]
        )
    sides: Counter[str] = Counter()
    spans: dict[str, set[str]] = {}
    for line in lines[naming[0] : naming[-1] + 1]:
        match = LOG_LINE.match(line)
        if match is None:
            continue
        ids = IDS.search(line)
        assert ids and ids.group("trace") == trace_id, line
        side = match.group("logger").split(".")[1]  # entrypoints (HTTP), engine, worker
        sides[side] += 1
        spans.setdefault(side, set()).add(ids.group("span"))
    # Several lines: the HTTP handler's, the engine's (admission, its dispatch thread)
    # and the worker's.
    assert (
        sides["entrypoints"] >= 1 and sides["engine"] >= 3 and sides["worker"] >= 2
    ), sides
    assert spans == {
        "entrypoints": {http.span_id},
        "engine": {http.span_id},
        "worker": {execute.span_id},
    }, spans


def by_name(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    named: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


def test_mp_request_is_one_trace_with_the_worker_process_spans(
    tiny_flux_dir, tmp_path, monkeypatch
) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    with OtlpReceiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_SERVICE_NAME": "diffserve-test",
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
            "DIFFSERVE_LOG_LEVEL": "DEBUG",
        }
        with serving(tiny_flux_dir, tmp_path, "mp", env, monkeypatch) as server:
            info = generate(server, {"traceparent": f"00-{trace_id}-{client_span}-01"})
            server_pid = server.proc.pid
        log = server.log()
        spans = receiver.spans()

    worker_pid = info["attestation"]["worker_pid"]
    assert info["attestation"]["executor"] == "mp" and worker_pid != server_pid
    ours = [s for s in spans if s.trace_id == trace_id]
    named = by_name(ours)
    # ONE trace: every span of the request is in the client's trace, and no other trace
    # has request spans.
    for name in (
        "diffserve.admission",
        "diffserve.queue_wait",
        "diffserve.execute",
        "diffserve.encode",
        "diffserve.denoise",
        "diffserve.decode",
        "diffserve.image_encode",
    ):
        assert len(named.get(name, [])) == 1, (name, sorted(named))
        assert all(s.trace_id == trace_id for s in spans if s.name == name), name
    (http,) = [s for s in named["POST /v1/images/generations"]]
    assert http.kind == SERVER_SPAN_KIND and http.parent_span_id == client_span
    assert http.attributes["http.response.status_code"] == 200
    assert http.attributes["diffserve.model"] == "tiny-flux"
    assert http.attributes["diffserve.request_id"] == info["request_id"]
    for name in (
        "diffserve.admission",
        "diffserve.queue_wait",
        "diffserve.execute",
        "diffserve.image_encode",
    ):
        assert named[name][0].parent_span_id == http.span_id, name

    # The worker's spans were made and exported by the worker process itself.
    (execute,) = named["diffserve.execute"]
    for span in (
        execute,
        *named["diffserve.encode"],
        *named["diffserve.denoise"],
        *named["diffserve.decode"],
    ):
        assert span.resource["process.pid"] == worker_pid, span.name
        assert span.resource["diffserve.process.role"] == "worker"
        assert span.resource["service.name"] == "diffserve-test"
    assert (
        http.resource["process.pid"] == server_pid
        and http.resource["diffserve.process.role"] == "server"
    )
    for name in ("diffserve.encode", "diffserve.denoise", "diffserve.decode"):
        assert named[name][0].parent_span_id == execute.span_id, name
    attributes = execute.attributes
    assert (
        attributes["diffserve.executor"] == "mp" and attributes["diffserve.rank"] == 0
    )
    assert (
        attributes["diffserve.world_size"] == 1 and attributes["diffserve.replica"] == 0
    )
    assert (
        attributes["diffserve.request_id"] == info["request_id"]
        and attributes["diffserve.batch.size"] == 1
    )
    assert (
        attributes["diffserve.model.family"] == "FluxPipeline"
        and attributes["diffserve.steps"] == STEPS
    )
    assert (
        attributes["diffserve.kernel.linear"]
        and attributes["diffserve.kernel.attention"]
    )
    assert set(attributes["diffserve.kernel.linear"]) == set(
        info["attestation"]["linear"]
    )
    assert (
        attributes["diffserve.conditioning_cache"]
        == info["attestation"]["conditioning_cache"]
    )

    # One step event per denoise step, in order, inside the denoise span.
    (denoise,) = named["diffserve.denoise"]
    steps = [event for event in denoise.events if event[0] == "diffserve.step"]
    assert [event[1]["diffserve.step"] for event in steps] == list(range(1, STEPS + 1))
    assert all(event[1]["diffserve.steps"] == STEPS for event in steps)
    encode, decode = named["diffserve.encode"][0], named["diffserve.decode"][0]
    assert execute.start_ns <= encode.start_ns <= encode.end_ns <= denoise.start_ns + 1
    assert denoise.end_ns <= decode.start_ns + 1 and decode.end_ns <= execute.end_ns
    # Log correlation: every line of the request, the worker process's included, names
    # its trace.
    assert_request_lines_traced(log, info["request_id"], trace_id, http, execute)
    assert f"from user 'tracer' trace_id={trace_id} span_id={http.span_id}" in log, log[
        -3000:
    ]
    assert "tracing on (server)" in log and "tracing on (worker)" in log


def test_uni_every_log_line_of_a_request_names_its_trace(
    tiny_flux_dir, tmp_path, monkeypatch
) -> None:
    """uni: the HTTP handler's task, the engine's dispatch thread and the worker thread
    share one process."""
    trace_id = secrets.token_hex(16)
    with OtlpReceiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
            "DIFFSERVE_LOG_LEVEL": "DEBUG",
        }
        with serving(tiny_flux_dir, tmp_path, "uni", env, monkeypatch) as server:
            info = generate(
                server,
                {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"},
                steps=1,
            )
        spans = by_name([s for s in receiver.spans() if s.trace_id == trace_id])

    assert info["attestation"]["executor"] == "uni"
    (http,), (execute,) = (
        spans["POST /v1/images/generations"],
        spans["diffserve.execute"],
    )
    assert_request_lines_traced(
        server.log(), info["request_id"], trace_id, http, execute
    )


def test_without_otel_environment_nothing_is_sent(
    tiny_flux_dir, tmp_path, monkeypatch
) -> None:
    # The receiver listens where an OTLP exporter sends by default (127.0.0.1:4318), so
    # a server that traced without being asked would be caught; with that port taken,
    # any port (the check is then on the log only).
    try:
        receiver = OtlpReceiver(port=4318)
    except OSError:
        receiver = OtlpReceiver()
    with (
        receiver,
        serving(
            tiny_flux_dir,
            tmp_path,
            "uni",
            {"DIFFSERVE_LOG_LEVEL": "DEBUG"},
            monkeypatch,
        ) as server,
    ):
        generate(
            server,
            {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"},
        )
        server.stop()
        assert receiver.posts == []
    log = server.log()
    assert "from user 'tracer'\n" in log  # the request's log line, in the plain format
    assert "tracing on" not in log and "trace_id=" not in log
