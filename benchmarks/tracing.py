"""(p) What OpenTelemetry tracing costs a request: HTTP latency of one tiny-model image
with tracing on (every span exported over OTLP/HTTP to a receiver on 127.0.0.1) against
off, through the OpenAI SDK.

One server in this process (uvicorn on a thread, the uni executor), so the worker's
spans are made and exported in the same process as the HTTP ones: the most a request's
latency can pay for tracing (on mp the worker's spans cost its own process). Tracing is
switched per block of requests (``provider.start_tracing`` / ``stop_tracing``, untimed),
blocks alternate off/on, and the batch span processor exports every 200 ms during an on
block, so the background export is part of what is measured.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.common import median, spread
from benchmarks.http_client import sync_call
from benchmarks.section import Section
from benchmarks.server import free_port
from benchmarks.settings import Settings

DTYPE = "float32"
# The batch span processor's delay during an on block: short, so exports run while
# requests do.
EXPORT_EVERY_MS = "200"


class OtlpSink:
    """An OTLP/HTTP endpoint on 127.0.0.1 that accepts every export (200, empty body)
    and counts them."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(size)
                sink.exports += 1
                sink.bytes += size
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def in_process_server(path: Path) -> Iterator[str]:
    """``diffserve``'s app around a uni engine on tiny-flux, served by uvicorn on a
    thread; yields its URL."""
    import uvicorn

    from diffserve.engine.async_engine import AsyncEngine
    from diffserve.entrypoints.openai.app import create_app

    engine = AsyncEngine(
        str(path), dtype=DTYPE, enforce_eager=True, distributed_executor_backend="uni"
    )
    app = create_app(engine, served_model_name=path.name)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", access_log=False
        )
    )
    thread = threading.Thread(target=server.run, name="bench-uvicorn", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)  # its lifespan shuts the engine down


@contextmanager
def tracing_on(endpoint: str) -> Iterator[None]:
    """Tracing on in this process, exporting to ``endpoint``, for the block; flushed and
    off after it."""
    from diffserve.tracing.provider import start_tracing, stop_tracing

    saved = {
        name: os.environ.get(name)
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY")
    }
    os.environ.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY=EXPORT_EVERY_MS
    )
    try:
        if not start_tracing("server"):
            raise RuntimeError(
                "tracing did not turn on (is diffserve[otel] installed?)"
            )
        yield
    finally:
        stop_tracing()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def timed_blocks(
    call: Callable[[], Any], sink: OtlpSink, rounds: int, block: int, warmup: int
) -> dict[str, list[float]]:
    """Seconds per request, per mode: ``rounds`` x (an off block, an on block) of
    ``block`` requests each, the order flipped every round."""
    for _ in range(warmup):
        call()
        with tracing_on(sink.endpoint):
            call()
    samples: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(rounds):
        for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
            with tracing_on(sink.endpoint) if mode == "on" else _nothing():
                for _ in range(block):
                    start = time.perf_counter()
                    call()
                    samples[mode].append(time.perf_counter() - start)
    return samples


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    # Off must be off: the environment's own OTEL_* would turn tracing on at the
    # server's start.
    inherited = {
        name: os.environ.pop(name)
        for name in list(os.environ)
        if name.startswith("OTEL_") or name == "DIFFSERVE_TRACE_STEPS"
    }
    if inherited:
        section.notes.append(
            "Set aside for the measurement (each block sets its "
            f"own): {', '.join(sorted(inherited))}."
        )
    try:
        _measure(section, settings, models)
    finally:
        os.environ.update(inherited)


def _measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    try:
        import opentelemetry.sdk.trace  # noqa: F401 - the on case needs the otel extra
    except ImportError as exc:
        raise ImportError(f"{exc}: install diffserve[otel]") from exc
    case = settings.tracing_case
    path = models[case.model]
    section.notes.append(
        f"{case.label}, {DTYPE}, eager, uni executor in the "
        "benchmark's process behind uvicorn, "
        "OpenAI SDK; on = every span exported over OTLP/HTTP "
        "to a receiver on 127.0.0.1 "
        f"(batch span processor every {EXPORT_EVERY_MS} ms); "
        f"blocks of {settings.tracing_block} "
        f"requests, off and on alternating, {settings.tracing_rounds} round(s)."
    )
    section.columns = ["tracing", "median ms", "spread ±", "requests", "vs off"]
    sink = OtlpSink()
    try:
        with in_process_server(path) as url:
            call = sync_call(url, path.name, case)
            samples = timed_blocks(
                call,
                sink,
                settings.tracing_rounds,
                settings.tracing_block,
                settings.warmup,
            )
    finally:
        sink.close()
    off, on = median(samples["off"]) * 1000.0, median(samples["on"]) * 1000.0
    for mode, value in (("off", off), ("on", on)):
        section.add(
            mode,
            round(value, 2),
            f"{spread(samples[mode]):.0%}",
            len(samples[mode]),
            f"{value / off:.3f}x" if off else "",
        )
    section.metrics.update(
        {
            "tracing.off.median_ms": off,
            "tracing.on.median_ms": on,
            "tracing.ratio": on / off if off else float("nan"),
        }
    )
    section.notes.append(
        f"The receiver got {sink.exports} export request(s), "
        f"{sink.bytes / 1024:.1f} KiB in all."
    )
    if not sink.exports:
        raise RuntimeError("tracing on exported nothing to the receiver")
