"""A disconnect storm: clients (half SSE) drop requests while queued, mid-denoise and
around decode/encode. Afterwards the gauges are back to 0 and every dropped request is
accounted for.

The exact criterion: ``aborted + completed == dropped``, where ``aborted`` is the
increase of ``diffserve_requests_aborted_total`` and ``completed`` that of
``diffserve_request_phase_seconds_count {phase="total"}`` (observed once per response
built). A request dropped during the last moments can legitimately finish before the
server notices, so only the sum is exact; the requests that could not have finished
(queued, or hundreds of steps from done) must be among the aborted.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from adversarial_helpers import API_KEY, assert_clean_log, generate_ok, metric, scrape

pytestmark = pytest.mark.e2e

LONG = {"prompt": "long", "size": "256x256", "num_inference_steps": 400}
ENCODE_HEAVY = {"prompt": "decode", "size": "256x256", "num_inference_steps": 2, "n": 4}
COMPLETED = 'diffserve_request_phase_seconds_count{phase="total"}'
ABORTED = "diffserve_requests_aborted_total"


class RawRequest:
    """A POST on its own socket, so the test decides exactly when the client goes
    away."""

    def __init__(self, url: str, body: dict) -> None:
        host, port = url.removeprefix("http://").split(":")
        data = json.dumps(body).encode()
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.sendall(
            (
                "POST /v1/images/generations "
                f"HTTP/1.1\r\nHost: {host}\r\nAuthorization: "
                "Bearer "
                f"{API_KEY}\r\nContent-Type: application/json\r\nContent-Length: "
                f"{len(data)}\r\n\r\n"
            ).encode()
            + data
        )
        self.buffer = b""

    def read_until(self, marker: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            assert time.monotonic() < deadline, self.buffer[-300:]
            chunk = self.sock.recv(65536)
            assert chunk, self.buffer[-300:]
            self.buffer += chunk

    def drop(self) -> None:
        # SO_LINGER 0: a reset, as when a client process dies, not a polite half-close.
        self.sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
        )
        self.sock.close()


def wait_for(server, name: str, value: float, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while metric(scrape(server), name) != value:
        assert time.monotonic() < deadline, f"{name} did not reach {value}"
        time.sleep(0.02)


def test_disconnect_storm_leaves_nothing_behind(busy_server) -> None:
    url = busy_server.url
    generate_ok(busy_server, size="256x256")  # warm the shape
    before = scrape(busy_server)
    dropped = 0
    cannot_finish = 0
    for stream in (True, False):
        # A request dropped during decode keeps the engine busy until its decode ends
        # (aborts act between denoise steps); a blocking request first makes sure the
        # engine is idle, so the queue below holds exactly what this round sends.
        generate_ok(busy_server)
        # Mid-denoise: a long request, dropped after it has started stepping.
        running = RawRequest(url, {**LONG, "stream": stream})
        if stream:
            running.read_until(b'"step":2,')
        else:
            wait_for(busy_server, "diffserve_inflight_requests", 1)
            wait_for(busy_server, "diffserve_queue_depth", 0)
            time.sleep(0.3)
        # While queued: two more behind it (max_queue=2), dropped once both are waiting.
        queued = [
            RawRequest(url, {**LONG, "stream": s, "seed": i})
            for i, s in enumerate((stream, not stream))
        ]
        wait_for(busy_server, "diffserve_queue_depth", 2)
        for request in queued:
            request.drop()
        wait_for(busy_server, "diffserve_queue_depth", 0)
        running.drop()
        wait_for(busy_server, "diffserve_inflight_requests", 0)
        dropped += 3
        cannot_finish += 3
        # Around decode and encode: four 256x256 images after two steps.
        late = RawRequest(url, {**ENCODE_HEAVY, "stream": stream})
        if stream:
            late.read_until(b'"step":2,"total_steps":2')
        else:
            time.sleep(0.15)
        late.drop()
        dropped += 1
        wait_for(busy_server, "diffserve_inflight_requests", 0)
    wait_for(busy_server, "diffserve_queue_depth", 0)
    after = scrape(busy_server)
    aborted = metric(after, ABORTED) - metric(before, ABORTED)
    # Less the two idle checks.
    completed = metric(after, COMPLETED) - metric(before, COMPLETED) - 2
    assert aborted + completed == dropped, (aborted, completed, dropped)
    assert aborted >= cannot_finish
    assert metric(after, "diffserve_inflight_requests") == 0
    assert_clean_log(busy_server)
    generate_ok(busy_server)
