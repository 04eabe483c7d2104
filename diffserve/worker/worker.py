"""The worker: one device, one pipeline, the extension hooks, and the execution of one
batch.

A worker knows nothing about transport. The command loop (``loop.py``) drives it, in a
thread of the engine's process (uni) or in a spawned process (mp), so its behaviour is
identical on both.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from diffserve.errors import WorkerError
from diffserve.layers.attestation import KernelCounters
from diffserve.layers.collectives import CollectiveCounters
from diffserve.logging import get_logger
from diffserve.models.base import BuildContext, ParallelContext, Pipeline
from diffserve.models.inspect import weights_fingerprint
from diffserve.registry.models import MODEL_FAMILIES
from diffserve.types.attestation import (
    Attestation,
    HubModelReport,
    KernelTally,
    ParallelLayout,
)
from diffserve.types.messages import WorkerInfo
from diffserve.types.results import BatchResult, RequestResult, StepEvent
from diffserve.worker.compile_cache import use_compile_cache
from diffserve.worker.device import device_for
from diffserve.worker.distributed import gather_to_rank0, init_parallel, stop_agreed
from diffserve.worker.extension import WorkerExtension, extension_method, load_extension

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.layers.observe import KernelObserver
    from diffserve.types.request import GenerationRequest

logger = get_logger(__name__)

# Worker methods an RPC may call by name (besides the extension's public methods).
BUILTIN_RPCS = frozenset(
    {"ping", "pid", "kernel_counters", "reset_kernel_counters", "describe"}
)


class Worker:
    """Owns the pipeline of one stage on one device; ``rank`` is its index in the
    executor."""

    def __init__(
        self,
        config: ResolvedConfig,
        stage_id: int,
        rank: int = 0,
        executor: str = "uni",
        replica: int = 0,
        init_method: str | None = None,
    ) -> None:
        self.config = config
        self.stage = config.stage(stage_id)
        self.rank = rank
        self.replica = replica
        self.executor = executor
        self.device = device_for(self.stage, rank, replica)
        self.extension: WorkerExtension | None = None
        self.pipeline: Pipeline | None = None
        self.kernel_observers: list[KernelObserver] = []
        self.batches_run = 0
        # The rendezvous of this replica's process group (``tcp://host:port``), set by
        # the executor when the stage spans several ranks; ``parallel`` is filled in by
        # ``load``.
        self.init_method = init_method
        self.parallel = ParallelContext()
        # Batches stopped by a cancel: (request ids, steps done, total steps), most
        # recent last.
        self.cancelled: list[dict[str, Any]] = []
        # Models/inspect.py: names, sizes and sha256 of the weight files loaded.
        self.weights_fingerprint = ""

    def observe_kernels(self, observer: KernelObserver) -> None:
        """Install a kernel observer (``layers.observe``) on the kernel set the pipeline
        is built with. Call it from an extension's ``before_load``; observers added
        after the build see nothing."""
        self.kernel_observers.append(observer)

    def load(self) -> WorkerInfo:
        """Instantiate the extension, run its hooks around the pipeline build; say what
        was loaded."""
        self.extension = load_extension(self.stage.worker_extension_cls)
        if self.extension is not None:
            self.extension.before_load(self)
        if self.config.model and self.config.model_family:
            family = MODEL_FAMILIES[self.config.model_family]
            # The groups exist only to serve the pipeline: a model-less group of ranks
            # serves RPCs alone. The batch deadline floor bounds a collective whose peer
            # never comes (no new key needed).
            self.parallel = init_parallel(
                self.stage,
                self.rank,
                self.device,
                self.init_method,
                float(self.config.server.batch_deadline_floor_s),
            )
            if not self.stage.enforce_eager:  # before anything compiles in this process
                use_compile_cache(self.config, self.device)
            # A staged topology: another stage encodes the prompts for the denoising
            # one.
            roles = {s.role for s in self.config.stages}
            denoising = self.stage.role == "diffusion"
            context = BuildContext(
                device=self.device,
                kernel_observers=tuple(self.kernel_observers),
                parallel=self.parallel,
                encoded_elsewhere=denoising and "text_encoder" in roles,
                decoded_elsewhere=denoising and "decoder" in roles,
            )
            pipeline_class = (
                family.load_pipeline_class(self.stage.implementation)
                if self.stage.role == "diffusion"
                else family.load_stage_pipeline(self.stage.role)
            )
            self.pipeline = pipeline_class.from_stage(
                self.config.model, self.stage, context
            )
            self.weights_fingerprint = weights_fingerprint(
                self.config.model, dict(self.stage.components)
            )
        else:
            logger.warning("no model configured: worker %d serves RPCs only", self.rank)
        if self.extension is not None:
            self.extension.after_load(self)
        logger.info(
            "worker rank=%d pid=%d ready on %s", self.rank, os.getpid(), self.device
        )
        capabilities = self.pipeline.capabilities if self.pipeline is not None else None
        weights = dict(self.pipeline.weights) if self.pipeline is not None else {}
        return WorkerInfo(
            pid=os.getpid(),
            device=str(self.device),
            capabilities=capabilities,
            weights=weights,
        )

    # -- batches
    # ----------------------------------------------------------------------------------

    def execute(
        self,
        batch: Sequence[GenerationRequest],
        on_step: Callable[..., None],
        should_stop: Callable[[], bool],
        joins: Callable[[], list[GenerationRequest]] | None = None,
        on_partial: Callable[[list[RequestResult]], None] | None = None,
    ) -> list[RequestResult] | None:
        """Run one batch. ``on_step(step, total, progress, previews)`` is called after
        every denoise step; when ``should_stop()`` turns true between steps the pipeline
        generator is closed and ``None`` is returned (cancelled). Step-level batching:
        ``joins`` adds requests at step boundaries and ``on_partial`` gets the results
        of requests that finish while the batch goes on (their attestation: the run so
        far)."""
        if self.pipeline is None:
            raise WorkerError(
                "this worker has no model loaded", remote_type="WorkerError"
            )
        counters = self.pipeline.kernel_counters
        counters.reset()
        # Warmup runs the real path but must not pollute the kernel counters that
        # requests report.
        pause = counters.paused() if all(r.is_warmup for r in batch) else nullcontext()
        result: BatchResult | None = None
        start = time.perf_counter()
        with pause:
            events = (
                self.pipeline.run(batch, joins)
                if joins is not None
                else self.pipeline.run(batch)
            )
            try:
                for event in events:
                    if isinstance(event, BatchResult):
                        result = event
                        # Delivered now; the final reply then holds none.
                        if on_partial is not None:
                            on_partial(
                                self._attest(event.outputs, counters, len(batch), start)
                            )
                        continue
                    on_step(
                        event.step, event.total_steps, event.progress, event.previews
                    )
                    if stop_agreed(self.parallel, should_stop(), self.device, counters):
                        self._record_cancel(batch, event)
                        return None
            finally:
                events.close()  # cancels a still-running denoise loop
        if result is None:
            raise WorkerError(
                "pipeline finished without a result", remote_type="WorkerError"
            )
        self.batches_run += 1
        if on_partial is not None:
            return []
        # One small gather of every rank's counters and per-request entries (all ranks
        # reach it: the stop decision is shared); how the ranks' entries combine is the
        # pipeline's (``merge_rank_outputs``).
        per_rank = gather_to_rank0(
            self.parallel,
            {
                "kernels": counters.snapshot(),
                "collectives": counters.collectives.snapshot(),
                "outputs": [o.attestation for o in result.outputs],
            },
        )
        attestation = self._attestation(
            counters, len(batch), (time.perf_counter() - start) * 1000.0, per_rank
        )
        if per_rank is not None and len(per_rank) > 1:
            self.pipeline.merge_rank_outputs(
                result.outputs, [tally["outputs"] for tally in per_rank]
            )
        for output in result.outputs:
            # The pipeline's own per-request entries (cache, lora) beside the batch's.
            output.attestation = {**attestation, **output.attestation}
        return result.outputs

    def _attest(
        self,
        outputs: list[RequestResult],
        counters: KernelCounters,
        batch_size: int,
        start: float,
    ) -> list[RequestResult]:
        """One rank's outputs with the attestation of the run so far (their own cache
        entries kept)."""
        attestation = self._attestation(
            counters, batch_size, (time.perf_counter() - start) * 1000.0
        )
        for output in outputs:
            output.attestation = {**attestation, **output.attestation}
        return outputs

    def _record_cancel(
        self, batch: Sequence[GenerationRequest], event: StepEvent
    ) -> None:
        self.cancelled = [
            *self.cancelled[-99:],
            {
                "request_ids": [r.request_id for r in batch],
                "steps_done": event.step,
                "total_steps": event.total_steps,
            },
        ]

    def _attestation(
        self,
        counters: KernelCounters,
        batch_size: int,
        batch_ms: float,
        per_rank: list[dict[str, Any]] | None = None,
    ) -> Attestation:
        parallel = self.stage.parallel
        layout = ParallelLayout(
            world_size=parallel.world_size,
            cfg_parallel_size=parallel.cfg_parallel_size,
            ulysses_degree=parallel.ulysses_degree,
        )
        if per_rank is None or len(per_rank) <= 1:
            totals: KernelTally = counters.snapshot()
            collectives = counters.collectives.snapshot()
        # rank 0 of several: the totals are the sums over ranks, each rank's own beside
        # them
        else:
            summed, summed_collectives = KernelCounters(), CollectiveCounters()
            for tally in per_rank:
                summed.add(tally["kernels"])
                summed.transformer_forwards += tally["kernels"]["transformer_forwards"]
                summed_collectives.add(tally["collectives"])
            totals, collectives = summed.snapshot(), summed_collectives.snapshot()
        attestation = Attestation(
            **totals,
            parallel=layout,
            collectives=collectives,
            executor=self.executor,
            worker_pid=os.getpid(),
            replica=self.replica,
            rank=self.rank,
            device=str(self.device),
            dtype=str(getattr(self.pipeline, "dtype", "")).removeprefix("torch."),
            batch_size=batch_size,
            batch_ms=round(batch_ms, 3),
            config_fingerprint=self.config.fingerprint,
        )
        if self.weights_fingerprint:
            attestation["weights_fingerprint"] = self.weights_fingerprint
        source = self.config.model_source
        if source is not None and source.repo_id:
            attestation["model_source"] = HubModelReport(
                repo_id=source.repo_id, revision=source.revision, commit=source.commit
            )
        if per_rank is not None and len(per_rank) > 1:
            attestation["per_rank"] = [tally["kernels"] for tally in per_rank]
        if self.pipeline is not None:
            capabilities = self.pipeline.capabilities
            attestation["model_family"] = capabilities.family
            attestation["implementation"] = capabilities.implementation
            attestation["batch_invariant"] = capabilities.batch_invariant
            quantized = {
                name: w.quantization
                for name, w in self.pipeline.weights.items()
                if w.quantization
            }
            if quantized:
                attestation["quantization"] = quantized
        return attestation

    # -- RPC
    # ----------------------------------------------------------------------------------

    def call(
        self,
        method: str | Callable[..., Any],
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Run an RPC: a callable(worker, ...), an extension method, or a built-in
        worker method."""
        kwargs = kwargs or {}
        if callable(method):
            return method(self, *args, **kwargs)
        if not isinstance(method, str):
            raise WorkerError(
                f"RPC method must be a name or a callable, got {type(method).__name__}"
            )
        if self.extension is not None:
            bound = extension_method(self.extension, method)
            if bound is not None:
                return bound(*args, **kwargs)
        if method in BUILTIN_RPCS:
            return getattr(self, method)(*args, **kwargs)
        raise WorkerError(
            f"no RPC method {method!r} on the worker or its extension "
            f"(built-ins: {', '.join(sorted(BUILTIN_RPCS))})",
            remote_type="AttributeError",
        )

    def ping(self) -> str:
        return "pong"

    def pid(self) -> int:
        return os.getpid()

    def kernel_counters(self) -> KernelTally:
        return (
            self.pipeline.kernel_counters.snapshot()
            if self.pipeline is not None
            else KernelTally()
        )

    def reset_kernel_counters(self) -> None:
        if self.pipeline is not None:
            self.pipeline.kernel_counters.reset()

    def describe(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "replica": self.replica,
            "pid": os.getpid(),
            "device": str(self.device),
            "executor": self.executor,
            "stage_id": self.stage.stage_id,
            "batches_run": self.batches_run,
            "cancelled": list(self.cancelled),
            "extension": type(self.extension).__qualname__
            if self.extension is not None
            else None,
        }
