"""The ``Pipeline`` protocol: what the worker needs from a model family, and nothing
more.

A family (one folder under ``diffserve/models/`` plus one entry in ``registry.models``)
provides a class that is built from the whole resolved ``StageConfig`` and a
``BuildContext`` (device, rank/parallel context, kernel observers), declares its
``capabilities`` (checked by the engine at admission, before a request can reach a
worker) and runs a homogeneous batch (one scheduler batch key) as a generator: one
``StepEvent`` per denoise step, then one ``BatchResult``. Closing the generator cancels
the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from diffserve.types.capabilities import PipelineCapabilities
from diffserve.types.memory import ComponentWeights

__all__ = ["BuildContext", "ParallelContext", "Pipeline", "PipelineCapabilities"]

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.schema import StageConfig
    from diffserve.layers.attestation import KernelCounters
    from diffserve.layers.observe import KernelObserver
    from diffserve.types.request import GenerationRequest
    from diffserve.types.results import BatchResult, RequestResult, StepEvent


@dataclass(frozen=True)
class ParallelContext:
    """Where this rank sits in its replica's worker group (built by
    ``worker/distributed.py``).

    Ranks are laid out CFG-major: ``rank = cfg_rank * ulysses_size + ulysses_rank``. A
    group is a ``torch.distributed`` process group, or ``None`` when that dimension has
    size 1 (nothing to exchange). It lives only in the worker process that built it
    (process groups do not pickle).
    """

    rank: int = 0
    world_size: int = 1
    cfg_rank: int = 0
    cfg_size: int = 1
    ulysses_rank: int = 0
    ulysses_size: int = 1
    cfg_group: Any = None
    ulysses_group: Any = None
    world_group: Any = None  # the default group; None on one rank

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass(frozen=True)
class BuildContext:
    """Everything a pipeline is built with besides the model directory and the stage
    config."""

    device: str = "cpu"
    parallel: ParallelContext = ParallelContext()
    kernel_observers: tuple[KernelObserver, ...] = ()
    # Another stage encodes the prompts (topology split_text_encoder): requests arrive
    # with their conditioning (models/flux/connector_payloads.py) and this stage loads
    # no text encoder.
    encoded_elsewhere: bool = False
    # Another stage decodes (topology encode_denoise_decode): this stage hands on
    # latents (models/flux/connector_payloads.py) instead of images.
    decoded_elsewhere: bool = False


@runtime_checkable
class Pipeline(Protocol):
    capabilities: PipelineCapabilities
    # Each loaded component's weights on its device (models/memory.py): the ready log,
    # /v1/config and the attestation's ``quantization`` entries come from here.
    weights: dict[str, ComponentWeights]

    @classmethod
    def from_stage(
        cls, model_dir: str | Path, stage: StageConfig, context: BuildContext
    ) -> Pipeline:
        """Load every component of ``model_dir``; kernels, dtype and compilation come
        from ``stage``."""
        ...

    @property
    def kernel_counters(self) -> KernelCounters:
        """The counters every Linear/Attention of the denoiser reports to (the
        attestation)."""
        ...

    def run(
        self,
        batch: Sequence[GenerationRequest],
        joins: Callable[[], list[GenerationRequest]] | None = None,
    ) -> Generator[StepEvent | BatchResult, None, None]:
        """Run one homogeneous batch whose requests already carry seeds. With
        ``step_batching``, ``joins`` is asked at every step boundary for requests of the
        same key to add."""
        ...

    def merge_rank_outputs(
        self, outputs: list[RequestResult], per_rank: list[list[dict[str, Any]]]
    ) -> None:
        """On rank 0 of a multi-rank layout: fold the other ranks' per-request
        attestation entries (``per_rank[rank][i]`` for ``outputs[i]``) into ``outputs``,
        in place (e.g. the step-cache decisions of a CFG-parallel negative branch). Only
        the pipeline knows which rank ran what."""
        ...


def library_admit(pipeline: Pipeline, request: GenerationRequest) -> GenerationRequest:
    """A library call's admission (an engine's is ``engine/admission.py``, through the
    same modality and edit rules): unset fields get the model family's defaults (the
    registry's, which an engine's deployment takes as its own unless it sets others) and
    the stage's cache threshold, and the request is checked against the pipeline's
    capabilities."""
    from diffserve.config.stage_sections import RequestDefaultsConfig
    from diffserve.registry.edits import admit_edit
    from diffserve.registry.models import MODEL_FAMILIES

    capabilities = pipeline.capabilities
    family = MODEL_FAMILIES[capabilities.family]
    defaults = RequestDefaultsConfig(**family.defaults.request_defaults())
    request = admit_edit(
        capabilities.modality.fill(request, defaults, capabilities), capabilities
    )
    request = request.with_defaults(
        cache_threshold=capabilities.default_cache_threshold
    )
    capabilities.check(request)
    return request


def run_one(pipeline: Pipeline, request: GenerationRequest) -> RequestResult:
    """Run one (seeded) request, admitted by ``library_admit``, through ``pipeline.run``
    to its result (library and test convenience)."""
    from diffserve.types.results import BatchResult

    for event in pipeline.run([library_admit(pipeline, request)]):
        if isinstance(event, BatchResult):
            return event.outputs[0]
    raise RuntimeError("pipeline run ended without a result")  # pragma: no cover
