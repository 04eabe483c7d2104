"""The worker: one device, one pipeline, the extension hooks, and the execution of one batch.

A worker knows nothing about transport. The command loop (``loop.py``) drives it, in a thread of the
engine's process (uni) or in a spawned process (mp), so its behaviour is identical on both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from diffserve.errors import WorkerError
from diffserve.executor.messages import WorkerOutput
from diffserve.logging import get_logger
from diffserve.worker.extension import load_extension

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolve import ResolvedConfig
    from diffserve.engine.request import GenerationRequest

logger = get_logger(__name__)

# Worker methods an RPC may call by name (besides the extension's public methods).
BUILTIN_RPCS = frozenset({"ping", "pid", "kernel_counters", "reset_kernel_counters", "describe"})


class Worker:
    """Owns the pipeline of one stage on one device; ``rank`` is its index in the executor."""

    def __init__(self, config: ResolvedConfig, stage_id: int, rank: int = 0, executor: str = "uni") -> None:
        self.config = config
        self.stage = next(s for s in config.stages if s.stage_id == stage_id)
        self.rank = rank
        self.executor = executor
        self.device = _device_for(self.stage, rank)
        self.extension: Any = None
        self.pipeline: Any = None
        self.batches_run = 0
        # Batches stopped by a cancel: (request ids, steps done, total steps), most recent last.
        self.cancelled: list[dict[str, Any]] = []

    def load(self) -> None:
        """Instantiate the extension, run its hooks around the pipeline build."""
        self.extension = load_extension(self.stage.worker_extension_cls)
        if self.extension is not None:
            self.extension.before_load(self)
        if self.config.model:
            self.pipeline = _build_pipeline(self.config.model, self.stage, self.device)
        else:
            logger.warning("no model configured: worker %d serves RPCs only", self.rank)
        if self.extension is not None:
            self.extension.after_load(self)
        logger.info("worker rank=%d pid=%d ready on %s", self.rank, os.getpid(), self.device)

    # -- batches ------------------------------------------------------------------------------------

    def execute(self, batch: list[GenerationRequest], on_step: Callable[[int, int], None],
                should_stop: Callable[[], bool]) -> list[WorkerOutput] | None:
        """Run one batch. ``on_step`` is called after every denoise step; when ``should_stop()`` turns
        true between steps the pipeline generator is closed and ``None`` is returned (cancelled)."""
        if self.pipeline is None:
            raise WorkerError("this worker has no model loaded", remote_type="WorkerError")
        counters = self.counters
        warmup = all(r.is_warmup for r in batch)
        if counters is not None:
            counters.reset()
        # Warmup must not pollute the kernel counters that requests report.
        pause = counters.paused() if (warmup and counters is not None) else nullcontext()
        result = None
        steps_done = 0
        start = time.perf_counter()
        with pause:
            events = self.pipeline.run(list(batch))
            try:
                for event in events:
                    if hasattr(event, "outputs"):
                        result = event
                    elif hasattr(event, "step"):
                        steps_done = int(event.step)
                        on_step(steps_done, int(event.total_steps))
                        if should_stop():
                            self.cancelled = [*self.cancelled[-99:], {
                                "request_ids": [r.request_id for r in batch], "steps_done": steps_done,
                                "total_steps": int(event.total_steps)}]
                            return None
            finally:
                events.close()  # cancels a still-running denoise loop
        if result is None:
            raise WorkerError("pipeline finished without a result", remote_type="WorkerError")
        self.batches_run += 1
        attestation = self._attestation(len(batch), (time.perf_counter() - start) * 1000.0)
        return [
            WorkerOutput(
                request_id=out.request_id,
                images=out.images,
                seeds=list(out.seeds),
                timings_ms=dict(getattr(out, "timings_ms", None) or getattr(out, "timings", None) or {}),
                attestation=dict(attestation),
            )
            for out in result.outputs
        ]

    def _attestation(self, batch_size: int, batch_ms: float) -> dict[str, Any]:
        counters = self.counters
        snapshot = counters.snapshot() if counters is not None else {}
        return {
            **snapshot,
            "executor": self.executor,
            "worker_pid": os.getpid(),
            "rank": self.rank,
            "device": str(self.device),
            "batch_size": batch_size,
            "batch_ms": round(batch_ms, 3),
            "config_fingerprint": self.config.fingerprint,
        }

    @property
    def counters(self) -> Any:
        transformer = getattr(self.pipeline, "transformer", None)
        return getattr(transformer, "counters", None)

    # -- RPC ----------------------------------------------------------------------------------------

    def call(self, method: Any, args: tuple = (), kwargs: dict[str, Any] | None = None) -> Any:
        """Run an RPC: a callable(worker, ...), an extension method, or a built-in worker method."""
        kwargs = kwargs or {}
        if callable(method):
            return method(self, *args, **kwargs)
        if not isinstance(method, str):
            raise WorkerError(f"RPC method must be a name or a callable, got {type(method).__name__}")
        if self.extension is not None:
            bound = _extension_method(self.extension, method)
            if bound is not None:
                return bound(*args, **kwargs)
        if method in BUILTIN_RPCS:
            return getattr(self, method)(*args, **kwargs)
        raise WorkerError(f"no RPC method {method!r} on the worker or its extension "
                          f"(built-ins: {', '.join(sorted(BUILTIN_RPCS))})", remote_type="AttributeError")

    def ping(self) -> str:
        return "pong"

    def pid(self) -> int:
        return os.getpid()

    def kernel_counters(self) -> dict[str, Any]:
        counters = self.counters
        return counters.snapshot() if counters is not None else {}

    def reset_kernel_counters(self) -> None:
        if self.counters is not None:
            self.counters.reset()

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "device": str(self.device), "executor": self.executor,
                "stage_id": self.stage.stage_id, "batches_run": self.batches_run,
                "cancelled": list(self.cancelled),
                "extension": type(self.extension).__qualname__ if self.extension is not None else None}


def _extension_method(extension: Any, name: str) -> Any | None:
    finder = getattr(extension, "rpc_method", None)
    if callable(finder):
        return finder(name)
    if name.startswith("_") or name in ("before_load", "after_load"):
        return None
    method = getattr(extension, name, None)
    return method if callable(method) else None


def _device_for(stage: Any, rank: int) -> str:
    """The torch device of ``rank``: the stage's device list if CUDA is present, else the CPU."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    devices = stage.devices
    if isinstance(devices, str):
        devices = [d for d in devices.replace(" ", "").split(",") if d and d != "auto"]
    devices = list(devices or [])
    index = devices[rank % len(devices)] if devices else rank
    text = str(index)
    return text if text.startswith(("cuda", "cpu")) else f"cuda:{text}"


def _build_pipeline(model_dir: str, stage: Any, device: str) -> Any:
    from diffserve.models.flux.pipeline import FluxPipeline

    if hasattr(FluxPipeline, "from_stage"):
        return FluxPipeline.from_stage(model_dir, stage, device=device)
    return FluxPipeline.from_pretrained(model_dir, stage=stage, device=device)
