"""The synchronous engine: ``Engine(model_dir,
deploy_config=...).generate(request)``."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from diffserve.engine.base import EngineBase
from diffserve.logging import get_logger
from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput

logger = get_logger(__name__)


class Engine(EngineBase):
    """Blocking front end. ``generate`` may be called from several threads; their
    requests batch."""

    def generate(
        self,
        request: GenerationRequest,
        *,
        timeout: float | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
    ) -> RequestOutput:
        """Run one request to completion. Raises ``RequestError`` before anything
        reaches a worker if the request is invalid; ``TimeoutError`` (after aborting it)
        if ``timeout`` seconds pass."""
        items: queue.Queue = queue.Queue()
        deadline = None if timeout is None else time.monotonic() + timeout
        state = self._core.submit(request, items.put)
        try:
            while True:
                try:
                    # The timeout covers the whole request, not the gap between progress
                    # events.
                    item = items.get(
                        timeout=None
                        if deadline is None
                        else max(0.0, deadline - time.monotonic())
                    )
                except queue.Empty:
                    raise TimeoutError(
                        f"request {state.request_id} did not finish within {timeout}s"
                    ) from None
                if isinstance(item, ProgressEvent):
                    if on_progress is not None:
                        on_progress(item)
                    continue
                if isinstance(item, BaseException):
                    raise item
                return item
        finally:
            # Timeout or KeyboardInterrupt: do not leave it running.
            if not state.finished:
                self._core.abort(state.request_id)

    def abort(self, request_id: str) -> bool:
        """Abort a queued or running request (from another thread). False if unknown or
        finished."""
        return self._core.abort(request_id)
