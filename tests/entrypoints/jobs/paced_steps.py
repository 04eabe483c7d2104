"""A worker extension for the video job fault tests (imported in the worker process: the
tests put this folder on the server's PYTHONPATH): every denoise step is followed by a
pause. A job meant to run "until something stops it" then spends its seconds asleep
instead of burning both cores; the faults under test (a DELETE, the job deadline, a
killed server or worker) act between steps either way, so what they prove does not
change."""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

from diffserve.types.results import StepEvent
from diffserve.worker.extension import WorkerExtension

STEP_PAUSE_S = 0.1


class PacedStepsExtension(WorkerExtension):
    """The pipeline's real steps, each followed by ``STEP_PAUSE_S`` of sleep."""

    def after_load(self, worker: Any) -> None:
        run = worker.pipeline.run

        def paced(*args: Any, **kwargs: Any) -> Generator[Any, None, None]:
            events = run(*args, **kwargs)
            try:
                for event in events:
                    yield event
                    if isinstance(event, StepEvent):
                        time.sleep(STEP_PAUSE_S)
            finally:
                # closing the pacer cancels the real denoise loop, as the worker expects
                events.close()

        worker.pipeline.run = paced
