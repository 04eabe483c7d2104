"""Slow and stalled clients on raw sockets: probes stay fast while hundreds trickle a
body, each of them is answered 408 and closed at the body deadline, unrouted uploads are
refused before their body is read, and connections beyond ``server.max_connections`` are
answered 503."""

from __future__ import annotations

import select
import socket
import time

import httpx
import pytest
from adversarial_helpers import API_KEY, GEN, rss_mib

pytestmark = pytest.mark.e2e

TRICKLERS = 180  # send one byte per round, never finish
STALLED = 20  # send headers, then nothing
BODY_TIMEOUT_S = 2.0  # server.body_timeout_s of the hardened server
SLACK_S = 2.0
MAX_CONNECTIONS = 240  # server.max_connections of the hardened server
RSS_GROWTH_LIMIT_MIB = 100


def open_upload(url: str, path: str, length: int) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: "
            f"Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        ).encode()
    )
    sock.setblocking(False)
    return sock


def collect(
    socks: list[socket.socket], until: float, trickle: set[socket.socket]
) -> dict[socket.socket, tuple[bytes, float]]:
    """Read each socket until the server closes it (or ``until``); trickle one byte a
    round into those in ``trickle``. Returns what each received and when it was closed
    (inf: still open)."""
    received = {s: b"" for s in socks}
    closed: dict[socket.socket, float] = {}
    while len(closed) < len(socks) and time.monotonic() < until:
        for sock in trickle - closed.keys():
            if received[sock]:
                continue  # answered: stop sending, so no reset races the answer
            try:
                sock.send(b" ")
            except OSError:
                # The server closed it; the read below sees the EOF.
                trickle = trickle - {sock}
        readable, _, _ = select.select(
            [s for s in socks if s not in closed], [], [], 0.2
        )
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if data:
                received[sock] += data
            else:
                closed[sock] = time.monotonic()
    return {s: (received[s], closed.get(s, float("inf"))) for s in socks}


def test_slow_and_stalled_bodies_hit_the_deadline_while_probes_stay_fast(
    hardened_server,
) -> None:
    url = hardened_server.url
    rss_before = rss_mib(hardened_server)
    # A 1 MiB upload to a path that does not exist is refused from the route table, body
    # unread: no byte of the body is ever sent, so a server that waited for it would
    # answer 408 at the body deadline instead. Checked before the clock of the deadline
    # test starts, with room for a loaded machine (CI once took over a second to answer
    # all ten while 200 uploads were being opened beside them).
    unrouted = [open_upload(url, "/v1/nowhere", 1 << 20) for _ in range(10)]
    early = collect(unrouted, time.monotonic() + BODY_TIMEOUT_S + 10.0, set())
    assert all(data.startswith(b"HTTP/1.1 404") for data, _ in early.values()), early
    for sock in unrouted:
        sock.close()
    start = time.monotonic()
    tricklers = [open_upload(url, GEN, 60_000) for _ in range(TRICKLERS)]
    stalled = [open_upload(url, GEN, 60_000) for _ in range(STALLED)]
    # Probes stay fast while 200 clients hold upload connections open.
    for _ in range(5):
        t = time.monotonic()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        assert time.monotonic() - t < 1.0
    assert time.monotonic() - start < BODY_TIMEOUT_S, (
        "setup too slow to observe the deadline"
    )
    everyone = tricklers + stalled
    answers = collect(everyone, start + BODY_TIMEOUT_S + SLACK_S, set(tricklers))
    for sock in everyone:
        sock.close()
    # Each one is closed within the deadline plus slack; the answer is a 408 unless a
    # reset (the trickle racing the close) discarded it on the client side.
    late = [
        (data[:40], round(closed - start, 2))
        for data, closed in answers.values()
        if closed > start + BODY_TIMEOUT_S + SLACK_S
    ]
    assert not late, f"{len(late)} connections were not closed in time: {late[:5]}"
    timed_out = [
        data for data, _ in answers.values() if data.startswith(b"HTTP/1.1 408")
    ]
    assert len(timed_out) >= 0.9 * len(everyone), [d[:20] for d, _ in answers.values()][
        :10
    ]
    assert all(
        b'"body_timeout"' in data and b"connection: close" in data.lower()
        for data in timed_out
    )
    assert all(data == b"" or data in timed_out for data, _ in answers.values())
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    assert rss_mib(hardened_server) - rss_before < RSS_GROWTH_LIMIT_MIB


def test_connections_beyond_max_connections_get_503(hardened_server) -> None:
    url = hardened_server.url
    time.sleep(0.5)  # let the server see the previous test's sockets close
    socks = [open_upload(url, GEN, 60_000) for _ in range(MAX_CONNECTIONS + 20)]
    try:
        answers = collect(socks, time.monotonic() + 1.0, set())
    finally:
        for sock in socks:
            sock.close()
    refused = [
        data for data, closed in answers.values() if data.startswith(b"HTTP/1.1 503")
    ]
    still_open = [
        data for data, closed in answers.values() if not data and closed == float("inf")
    ]
    # uvicorn's limit_concurrency answers a plain-text 503 and closes; the others wait
    # for their body.
    assert len(refused) >= 20, [d[:12] for d, _ in answers.values() if d][:5]
    assert len(still_open) <= MAX_CONNECTIONS
    # Once the held connections are gone, the server answers again.
    deadline = time.monotonic() + 5
    while httpx.get(url + "/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
