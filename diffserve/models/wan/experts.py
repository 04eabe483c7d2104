"""Wan2.2's diffusion mixture of experts: the high-noise ``transformer`` runs the steps
whose timestep is at or above ``boundary_ratio * num_train_timesteps`` and the low-noise
``transformer_2`` the rest (diffusers' rule, exactly); Wan2.1 has one expert. Each
expert is its own component (its own weights, later its own dtype or quantization);
which expert ran at each step is attested. Nothing here belongs to a batch: each
request's schedule (``schedule.py``) picks and records its own experts, and the rows of
one step that belong to different experts run apart (``routing.py``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from diffserve.errors import ModelLoadError
from diffserve.layers.attestation import KernelCounters
from diffserve.models.wan.params import WanParams
from diffserve.models.wan.transformer import WanTransformer


class Experts:
    def __init__(
        self, transformers: dict[str, WanTransformer], boundary_ratio: float | None
    ) -> None:
        if "transformer" not in transformers:
            raise ModelLoadError("a Wan model needs its transformer/ component")
        if len(transformers) > 1 and boundary_ratio is None:
            raise ModelLoadError(
                "a Wan model with transformer_2 needs model_index.json's boundary_ratio"
            )
        shapes = {
            name: (t.params.in_channels, t.params.out_channels, t.params.patch_size)
            for name, t in transformers.items()
        }
        if len(set(shapes.values())) != 1:
            raise ModelLoadError(
                f"Wan experts disagree on their input and output shapes: {shapes}"
            )
        self.transformers = transformers
        self.boundary_ratio = (
            None if len(transformers) == 1 else float(boundary_ratio or 0.0)
        )

    @property
    def params(self) -> WanParams:
        return self.transformers["transformer"].params

    @property
    def counters(self) -> KernelCounters:
        return self.transformers["transformer"].counters

    def rope(self, latents: Tensor) -> tuple[Tensor, Tensor]:
        return self.transformers["transformer"].rope(latents)

    def boundary_timestep(self, num_train_timesteps: int) -> float | None:
        """The timestep at and above which the high-noise expert runs (None: one
        expert)."""
        if self.boundary_ratio is None:
            return None
        return self.boundary_ratio * num_train_timesteps

    def names(self, timesteps: Tensor, boundary_timestep: float | None) -> list[str]:
        """The expert of every timestep of a schedule. The comparison is diffusers'
        own (``t >= boundary_timestep`` on the timesteps tensor), so the switch falls on
        the same step."""
        if boundary_timestep is None:
            return ["transformer"] * len(timesteps)
        return [
            "transformer" if high else "transformer_2"
            for high in (timesteps.cpu() >= boundary_timestep).tolist()
        ]

    def report(
        self, steps: list[str], boundary_timestep: float | None, cfg: bool
    ) -> dict[str, Any]:
        """One request's ``boundary_ratio`` and ``boundary_timestep``, the expert of
        every step it ran and each expert's forward calls per video (``cfg``: a guided
        step runs its expert twice)."""
        per_step = 2 if cfg else 1
        return {
            "boundary_ratio": self.boundary_ratio,
            "boundary_timestep": boundary_timestep,
            "steps": list(steps),
            "forwards": {
                name: per_step * steps.count(name) for name in self.transformers
            },
        }
