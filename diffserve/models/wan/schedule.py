"""One Wan request's schedule (``models/runner``'s ``Schedule``): a fresh copy of the
model's own diffusers scheduler (UniPC over flow sigmas) and the expert of each step.

Every request of a step-level batch gets its own: a multistep solver keeps a history of
its last predictions, and that history must be the request's alone (as when it runs
alone), whatever rows joined or left beside it, so its video does not depend on the
batch it ran in."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from diffserve.models.wan.experts import Experts


class WanSchedule:
    """``steps`` steps of one request: its timesteps, its solver, its experts."""

    def __init__(
        self,
        scheduler_config: dict[str, Any],
        steps: int,
        experts: Experts,
        device: torch.device,
    ) -> None:
        import diffusers

        config = dict(scheduler_config)
        scheduler_class = getattr(
            diffusers, str(config.get("_class_name", "UniPCMultistepScheduler"))
        )
        self.scheduler = scheduler_class.from_config(config)
        self.scheduler.set_timesteps(steps, device=device)
        self.scheduler.set_begin_index(0)
        self.steps = steps
        self.timesteps: Tensor = self.scheduler.timesteps
        self.boundary_timestep = experts.boundary_timestep(
            self.scheduler.config.num_train_timesteps
        )
        # Picked once per request from its timesteps (one device read at join, none
        # per step); ``begin`` records the steps it ran for the attestation.
        self.names = experts.names(self.timesteps, self.boundary_timestep)
        self.ran: list[str] = []

    def timestep(self, step: int) -> Tensor:
        """The 0-d timestep of ``step``, as the transformer takes it."""
        return self.timesteps[step]

    def expert(self, step: int) -> str:
        """The name of the expert that runs ``step``."""
        return self.names[step]

    def begin(self, step: int) -> bool:
        """Record this step's expert; True at Wan2.2's boundary (the runner then
        forgets this request's cached residuals)."""
        name = self.names[step]
        switched = bool(self.ran) and self.ran[-1] != name
        self.ran.append(name)
        return switched

    def step(self, latents: Tensor, velocity: Tensor, step: int) -> Tensor:
        """This request's rows after ``step`` (its solver history only)."""
        # The solver counts its own steps: one call per step, in order.
        index = getattr(self.scheduler, "step_index", None)
        if index is not None and index != step:
            raise RuntimeError(f"Wan schedule stepped {step} at its step {index}")
        return self.scheduler.step(
            velocity, self.timesteps[step], latents, return_dict=False
        )[0]
