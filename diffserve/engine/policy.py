"""What the scheduler charges for a request and how much one batch may hold: the
scheduling policy of a stage, derived once the replicas' capabilities are known (the
ready handshake), so the cost model is the model's own (``PipelineCapabilities.cost``).

- ``step_level``: the stage joins requests into a running batch at step boundaries
  (``batching: step``, ``max_batch_size`` > 1 and a native runner that can), so its
  lanes are ``(step_key, group_key)`` and a batch mixes lanes of one ``step_key``;
  otherwise a batch is one ``batch_key``.
- ``budget``: the step tokens one batch may run per denoising step (``max_step_tokens``;
  0 there = ``max_batch_size`` default requests of the model). A single request above
  it still runs, alone.
- ``quantum``: the token-steps a lane earns per turn of the deficit round robin
  (``queues.py``): one full batch of default requests, so a lane of default requests
  gets one batch per turn and a lane of cheaper ones proportionally more.

A stage without capabilities (a model-less engine, the encode/decode stages and the AR
stages, which never configure one) charges every request 1 and has no token budget:
its lanes take turns of ``max_batch_size`` requests.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffserve.types.batching import batch_key, group_key, step_key
from diffserve.types.request import GenerationRequest

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.schema import StageConfig
    from diffserve.types.capabilities import PipelineCapabilities

Cost = Callable[[GenerationRequest], int]


def unit(request: GenerationRequest) -> int:
    """Every request costs the same: scheduling by request count."""
    return 1


@dataclass(frozen=True)
class SchedulePolicy:
    """How one stage's scheduler forms batches (see the module docstring)."""

    step_level: bool = False
    cost: Cost = unit  # token-steps of a whole request
    step_tokens: Cost = unit  # tokens one step of a request runs
    budget: int = 0  # step tokens per batch; 0: no token cap (count only)
    quantum: int = 0  # token-steps a lane earns per turn; 0: max_batch_size

    def lane_key(self, request: GenerationRequest) -> Hashable:
        """The queue a waiting request sits in."""
        if self.step_level:
            return (step_key(request), group_key(request))
        return batch_key(request)

    def ring_key(self, request: GenerationRequest) -> Hashable:
        """The lanes that may share one batch (and its joins): one ``step_key``, or
        every lane of a request-level stage (whose batches still keep to one lane)."""
        return step_key(request) if self.step_level else None


def joins_steps(stage: StageConfig, capabilities: PipelineCapabilities | None) -> bool:
    """Whether ``stage``'s batches run step-level (``batch_run.py`` joins into them)."""
    return (
        stage.batching == "step"
        and stage.max_batch_size > 1
        and capabilities is not None
        and capabilities.step_batching
    )


def default_request(
    stage: StageConfig, capabilities: PipelineCapabilities
) -> GenerationRequest:
    """A request that sets nothing, as admission fills it (the deployment's default
    size, steps and frames; n=1): the unit of the automatic budget."""
    from diffserve.engine.admission import fill_defaults

    return fill_defaults(
        GenerationRequest(prompt="budget", request_id="step-budget"),
        stage.request_defaults,
        capabilities,
    )


def schedule_policy(
    stage: StageConfig, capabilities: PipelineCapabilities | None
) -> SchedulePolicy:
    """The policy of ``stage`` serving a model with ``capabilities``."""
    if capabilities is None:
        return SchedulePolicy()
    default = default_request(stage, capabilities)
    budget = stage.max_step_tokens or stage.max_batch_size * capabilities.step_tokens(
        default
    )
    steps = max(1, default.num_inference_steps or 1)
    return SchedulePolicy(
        step_level=joins_steps(stage, capabilities),
        cost=capabilities.cost,
        step_tokens=capabilities.step_tokens,
        budget=max(1, budget),
        quantum=max(1, budget) * steps,
    )
