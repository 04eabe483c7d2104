"""What a native family hands the shared runner (``models/runner/loop.py``):
model-shaped values only.

In the spirit of BFL's reference code a family writes four steps, encode, prepare
latents, one velocity call and decode, plus a ``Sampler`` for its schedule; the runner
owns everything between them (batch plan, joins, CFG branches, step caches, LoRA
activation, Ulysses sharding, peaks, timings, results, attestation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor


@dataclass
class Prepared:
    """The rows of requests about to join the batch, before their first step.

    ``extras`` are per-row values the velocity or ``after_step`` need (a dataclass,
    tuple or tensor whose tensors have one row per image: an edit's clean latents and
    mask, a first frame, a reference image's tokens); ``shared`` is one value for every
    row of the batch key (a rotary table). ``start_step`` is the step the rows start at
    (an edit of strength < 1 skips the schedule's first steps)."""

    latents: Tensor
    extras: Any = None
    shared: Any = None
    start_step: int = 0


@dataclass
class Decoded:
    """What ``decode`` made of finished rows: one tensor per request (images, videos or
    latents), whether the VAE tiled, and, when another stage decodes, what is handed on
    per request (the family's own payload, carried opaque by the engine to its decoding
    stage)."""

    outputs: list[Tensor]
    vae_tiled: bool | None = None
    handoffs: list[Any] = field(default_factory=list)


class Schedule(Protocol):
    """One request's schedule (each request of a step-level batch has its own: its own
    step count, its own solver history). Its rows carry their step index; the runner
    calls ``begin`` and ``step`` once per step with that index."""

    steps: int  # the request's denoising steps

    def begin(self, step: int) -> bool:
        """Before step ``step`` (0-based): True when another denoiser takes over from
        here for this request (a mixture of experts' boundary), so its rows' step
        caches must not reuse the last denoiser's residuals."""
        ...

    def step(self, latents: Tensor, velocity: Tensor, step: int) -> Tensor:
        """This request's rows after step ``step``."""
        ...
