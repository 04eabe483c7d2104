"""Where a generic batch sees its denoising steps, for pipelines that give no step
callback (HunyuanVideo-1.5's ``__call__`` has neither ``callback_on_step_end`` nor
``callback``): its scheduler's ``step``, which the denoising loop calls once per step,
after the step's transformer forwards. The hook runs after each step returns, so
progress, the step cache's step count and an abort (raised from the hook, out of the
pipeline's loop) work as with a callback; the VAE decode after the last step is the
"decode" phase either way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class SchedulerStepHook:
    """Wraps ``pipe.scheduler.step`` once; while a batch runs, ``on_step(pipe, index,
    timestep, {})`` is called after each of its steps (``index`` from 0)."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.on_step: Callable[..., Any] | None = None
        self.index = 0
        scheduler = pipe.scheduler
        step = scheduler.step

        def hooked(model_output: Any, timestep: Any, *args: Any, **kwargs: Any) -> Any:
            out = step(model_output, timestep, *args, **kwargs)
            if self.on_step is not None:
                index, self.index = self.index, self.index + 1
                self.on_step(self.pipe, index, timestep, {})
            return out

        scheduler.step = hooked

    def run(self, on_step: Callable[..., Any], call: Callable[[], Any]) -> Any:
        """``call()`` with ``on_step`` seeing each of its steps."""
        self.on_step, self.index = on_step, 0
        try:
            return call()
        finally:
            self.on_step = None
