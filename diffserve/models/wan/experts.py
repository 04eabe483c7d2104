"""Wan2.2's diffusion mixture of experts: the high-noise ``transformer`` runs the steps
whose timestep is at or above ``boundary_ratio * num_train_timesteps`` and the low-noise
``transformer_2`` the rest (diffusers' rule, exactly); Wan2.1 has one expert. Each
expert is its own component (its own weights, later its own dtype or quantization);
which expert ran at each step is attested."""

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
        self.steps: list[str] = []
        self.boundary_timestep: float | None = None
        self.switched = False  # the last pick changed expert (Wan2.2's boundary)

    @property
    def params(self) -> WanParams:
        return self.transformers["transformer"].params

    @property
    def counters(self) -> KernelCounters:
        return self.transformers["transformer"].counters

    def rope(self, latents: Tensor) -> tuple[Tensor, Tensor]:
        return self.transformers["transformer"].rope(latents)

    def start(self, timesteps: Tensor, num_train_timesteps: int) -> None:
        """A new batch: forget the last one's steps; the boundary of this schedule."""
        self.steps = []
        self.boundary_timestep = (
            None
            if self.boundary_ratio is None
            else self.boundary_ratio * num_train_timesteps
        )

    def pick(self, t: Tensor, num_train_timesteps: int) -> WanTransformer:
        """The expert of timestep ``t`` (recorded for the attestation)."""
        boundary = self.boundary_timestep
        name = "transformer" if boundary is None or t >= boundary else "transformer_2"
        self.switched = bool(self.steps) and self.steps[-1] != name
        self.steps.append(name)
        return self.transformers[name]

    def report(self, cfg: bool) -> dict[str, Any]:
        """The last batch's ``boundary_ratio`` and ``boundary_timestep``, the expert of
        every step and each expert's forward calls per video (``cfg``: a guided step
        runs its expert twice)."""
        per_step = 2 if cfg else 1
        return {
            "boundary_ratio": self.boundary_ratio,
            "boundary_timestep": self.boundary_timestep,
            "steps": list(self.steps),
            "forwards": {
                name: per_step * self.steps.count(name) for name in self.transformers
            },
        }
