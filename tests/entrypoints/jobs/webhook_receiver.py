"""A real webhook receiver for the webhook tests: a threaded HTTP server on 127.0.0.1
that answers each POST as told (``ok``: 204, ``fail``: 500, ``hang``: holds the request
until released or ``hang_s`` passes, ``redirect``: 302 to another host), records every
delivery's headers and body, and verifies each one's signature with an independent
implementation, the ``standardwebhooks`` package (Standard Webhooks' own)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    answer: str  # the mode it was answered in

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]


class Receiver:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self.mode = "ok"
        self.script: list[str] = []  # modes for the next requests, then ``mode``
        self.hang_s = 30.0
        self.redirect_to = "http://169.254.169.254/latest"  # where ``redirect`` points
        self.deliveries: list[Delivery] = []
        self.arrived = threading.Condition()
        self.release = threading.Event()

    def answer_next(self, *modes: str) -> None:
        self.script.extend(modes)

    def record(self, delivery: Delivery) -> None:
        with self.arrived:
            self.deliveries.append(delivery)
            self.arrived.notify_all()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Delivery]:
        """The deliveries, once at least ``count`` arrived (TimeoutError else)."""
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.deliveries) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{len(self.deliveries)} of {count} deliveries in {timeout} s"
                    )
                self.arrived.wait(left)
            return list(self.deliveries)

    def ids(self) -> list[str]:
        return [d.id for d in self.deliveries]


def verified(delivery: Delivery, *secrets: str) -> dict:
    """The payload, once the signature verified with each of ``secrets`` alone (the
    standardwebhooks package raises otherwise)."""
    payload: dict = {}
    for secret in secrets:
        payload = Webhook(secret).verify(delivery.body, delivery.headers)
    return payload


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            mode = receiver.script.pop(0) if receiver.script else receiver.mode
            headers = {k.lower(): v for k, v in self.headers.items()}
            receiver.record(Delivery(self.path, headers, body, mode))
            if mode == "hang":
                receiver.release.wait(receiver.hang_s)
            try:
                if mode == "fail":
                    self.send_response(500)
                elif mode == "redirect":
                    self.send_response(302)
                    self.send_header("Location", receiver.redirect_to)
                else:
                    self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except OSError:
                pass  # the sender gave up (a timeout, a killed server)

    return Handler


@contextmanager
def receiver() -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 and a free port, stopped after (hung requests
    released)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server.daemon_threads = True
    running = Receiver(server)
    server.RequestHandlerClass = _handler(running)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield running
    finally:
        running.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
