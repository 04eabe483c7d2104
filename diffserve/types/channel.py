"""Channels that carry ``Command``/``Reply`` messages: in-process queues (uni) or a pipe
(mp).

The pipe channel pickles messages with the plain pickler (never torch's fd-sharing
reductions, whose shared segments leak when a reader dies) and sends image tensors as
raw frames after the header: the receiver allocates the tensor and reads the bytes
straight into it, one copy, owned by the receiver from then on.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import threading
from abc import ABC, abstractmethod
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from diffserve.types.messages import Reply
from diffserve.types.results import RequestResult


class ChannelClosed(Exception):
    """The other end of a channel is gone (process exited or channel closed)."""


class Channel(ABC):
    """One end of a bidirectional message channel. ``send`` is thread-safe; one thread
    receives."""

    @abstractmethod
    def send(self, message: Any) -> None: ...

    @abstractmethod
    def poll(self, timeout: float | None = 0.0) -> bool:
        """True when ``recv`` would not block. ``None`` waits forever."""

    @abstractmethod
    def recv(self) -> Any:
        """Next message; raises ``ChannelClosed`` when the other end is gone."""

    def close(self) -> None:  # noqa: B027 - optional for in-process channels
        """Release OS resources (no-op for queues)."""


_CLOSED = object()


class QueueChannel(Channel):
    """In-process end: objects pass by reference (the uni executor's worker thread)."""

    def __init__(self, inbox: queue.Queue, outbox: queue.Queue) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self._peeked: list[Any] = []

    def send(self, message: Any) -> None:
        self._outbox.put(message)

    def poll(self, timeout: float | None = 0.0) -> bool:
        if self._peeked:
            return True
        try:
            self._peeked.append(
                self._inbox.get(timeout=timeout)
                if timeout != 0
                else self._inbox.get_nowait()
            )
        except queue.Empty:
            return False
        return True

    def recv(self) -> Any:
        message = self._peeked.pop() if self._peeked else self._inbox.get()
        if message is _CLOSED:
            self._peeked.append(_CLOSED)  # stay closed for every later recv
            raise ChannelClosed("queue channel closed")
        return message

    def close(self) -> None:
        self._outbox.put(_CLOSED)


def queue_channel_pair() -> tuple[QueueChannel, QueueChannel]:
    """(parent end, worker end) of an in-process channel."""
    to_worker: queue.Queue = queue.Queue()
    to_parent: queue.Queue = queue.Queue()
    return QueueChannel(to_parent, to_worker), QueueChannel(to_worker, to_parent)


class PipeChannel(Channel):
    """One end of a ``multiprocessing.Pipe`` (duplex): header pickles, then raw tensor
    frames."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()

    @property
    def connection(self) -> Connection:
        return self._conn

    def send(self, message: Any) -> None:
        header, tensors = _split_tensors(message)
        try:
            with self._send_lock:
                self._conn.send_bytes(
                    pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
                )
                for tensor in tensors:
                    # memoryview of the tensor's own memory: no staging copy on the send
                    # side.
                    self._conn.send_bytes(_byte_view(tensor))
        except (OSError, EOFError, ValueError) as exc:
            raise ChannelClosed(str(exc)) from exc

    def poll(self, timeout: float | None = 0.0) -> bool:
        try:
            return self._conn.poll(timeout)
        except (OSError, EOFError, ValueError):
            return True  # recv will raise ChannelClosed

    def recv(self) -> Any:
        try:
            message = pickle.loads(self._conn.recv_bytes())
            return _join_tensors(message, self._conn)
        except (OSError, EOFError, ValueError) as exc:
            raise ChannelClosed(str(exc)) from exc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.close()


def _split_tensors(message: Any) -> tuple[Any, list[Any]]:
    """Replace the image tensors of a result reply by (shape, dtype) so they travel as
    raw frames."""
    if not (
        isinstance(message, Reply)
        and message.kind in ("result", "partial")
        and isinstance(message.value, list)
        and message.value
        and all(isinstance(o, RequestResult) for o in message.value)
    ):
        return message, []
    tensors = [o.images.detach().to("cpu").contiguous() for o in message.value]
    metas = [
        replace(o, images=(tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        for o, t in zip(message.value, tensors, strict=False)
    ]
    return replace(message, value=metas), tensors


def _join_tensors(message: Any, conn: Connection) -> Any:
    if not (
        isinstance(message, Reply)
        and message.kind in ("result", "partial")
        and isinstance(message.value, list)
        and message.value
        and all(isinstance(o, RequestResult) for o in message.value)
    ):
        return message
    import torch

    outputs = []
    for output in message.value:
        shape, dtype = output.images
        tensor = torch.empty(shape, dtype=getattr(torch, dtype))
        if tensor.numel():
            conn.recv_bytes_into(_byte_view(tensor))
        else:
            conn.recv_bytes()
        outputs.append(replace(output, images=tensor))
    return replace(message, value=outputs)


def _byte_view(tensor: Any) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (any dtype, bf16
    included)."""
    import torch

    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
