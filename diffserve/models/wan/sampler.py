"""One Wan batch's schedule (``models/runner``'s ``Sampler``): the model's own diffusers
scheduler (UniPC over flow sigmas), which keeps a multistep history for the whole batch
(no joins), and the expert of each step."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from diffserve.models.wan.experts import Experts
from diffserve.models.wan.transformer import WanTransformer


class WanSampler:
    joinable = False  # the solver's history belongs to the batch

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
        # Fresh: multistep schedulers keep per-run state.
        self.scheduler = scheduler_class.from_config(config)
        self.scheduler.set_timesteps(steps, device=device)
        self.scheduler.set_begin_index(0)
        self.experts = experts
        self.train_steps = self.scheduler.config.num_train_timesteps
        experts.start(self.scheduler.timesteps, self.train_steps)
        self.expert: WanTransformer = experts.transformers["transformer"]

    def timestep(self, steps: list[int]) -> Tensor:
        # Every row of a Wan batch is at the same step.
        return self.scheduler.timesteps[steps[0]]

    def begin(self, steps: list[int]) -> bool:
        """Pick this step's expert; True at Wan2.2's boundary."""
        self.expert = self.experts.pick(self.timestep(steps), self.train_steps)
        return self.experts.switched

    def step(self, latents: Tensor, velocity: Tensor, steps: list[int]) -> Tensor:
        return self.scheduler.step(
            velocity, self.timestep(steps), latents, return_dict=False
        )[0]
