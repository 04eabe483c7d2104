"""A request inside the engine, from admission to its final item: what the scheduler's
lanes hold, a batch runs and the load report reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput

# What a request's sink receives: its ProgressEvents, then exactly one final item (an
# output or an error).
FinalItem = RequestOutput | BaseException
Sink = Callable[[ProgressEvent | FinalItem], None]


@dataclass(eq=False)
class RequestState:
    """A request inside the engine, from admission to its final item."""

    request: GenerationRequest
    sink: Sink
    arrival: float = field(default_factory=time.monotonic)
    started: float | None = None
    aborted: bool = False
    finished: bool = False
    # Staged topologies: an attestation entry per stage it went through before this one,
    # and what those stages report at the top level of the final attestation
    # (engine/encode_stage.py).
    stages: list[dict[str, Any]] = field(default_factory=list)
    carried: dict[str, Any] = field(default_factory=dict)
    # E.g. the text-encoder stage's "encode".
    stage_timings_ms: dict[str, float] = field(default_factory=dict)
    # AR stages (engine/ar_stage.py): the prompt as the client wrote it, the attestation
    # entry of each AR stage it went through, and the prompt they drew (None: no AR
    # stage rewrote it).
    original_prompt: str | None = None
    ar: list[dict[str, Any]] = field(default_factory=list)
    revised_prompt: str | None = None
    # encode_denoise_decode: the denoising stage's result while the decoding stage
    # works, and its queue time.
    handed: Any = None
    queue_ms: float = 0.0
    # Where it runs and how far it got (engine/load.py: the outstanding work a router
    # sees).
    replica: int | None = None
    steps_done: int = 0
    # Its place in the stage's arrival order while it waits (``queues.py``).
    seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def finish(self, item: FinalItem) -> bool:
        """Deliver the final item exactly once (an abort may race the batch's
        result)."""
        with self.lock:
            if self.finished:
                return False
            self.finished = True
        self.sink(item)
        return True
