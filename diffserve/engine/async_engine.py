"""The asyncio engine: ``async for event in engine.generate(request)`` yields
``ProgressEvent``s, then the ``RequestOutput``. The engine loop runs on its own thread;
events cross into the caller's event loop with ``call_soon_threadsafe``, one queue per
request, so a slow consumer never blocks others."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from diffserve.engine.base import EngineBase
from diffserve.logging import get_logger
from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput

logger = get_logger(__name__)


class AsyncEngine(EngineBase):
    """Asyncio front end. Construction blocks while the model loads (call it in a thread
    from a loop)."""

    async def generate(
        self, request: GenerationRequest
    ) -> AsyncIterator[ProgressEvent | RequestOutput]:
        """Progress events, then the output. Closing the iterator early aborts the
        request.

        Invalid requests raise ``RequestError`` at the first ``__anext__``; a full queue
        raises ``EngineOverloadedError``; a dead engine ``EngineDeadError``.
        """
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()

        def sink(item: Any) -> None:
            # RuntimeError: the caller's loop is closed; nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(items.put_nowait, item)

        state = self._core.submit(request, sink)
        try:
            while True:
                item = await items.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, RequestOutput):
                    return
        finally:
            # Consumer went away (disconnect, cancel): free the slot.
            if not state.finished:
                self._core.abort(state.request_id)

    async def abort(self, request_id: str) -> bool:
        """Abort a queued request, or a running one at its next denoise step."""
        return self._core.abort(request_id)
