"""One denoise step of a batch on this rank: every row's velocity (through the step cache when the batch runs
one), the true-CFG combination (both branches here, or one per rank of a CFG-parallel group), the Euler
step; and the full latents from a Ulysses group's shards."""

from __future__ import annotations

import torch
from torch import Tensor

from diffserve.layers.collectives import all_gather_into
from diffserve.models.base import ParallelContext
from diffserve.models.flux.conditioning import Conditioning
from diffserve.models.flux.sampling import euler_step
from diffserve.models.flux.step_cache import cached_velocity
from diffserve.models.flux.transformer import FluxTransformer
from diffserve.models.stepcache.policy import BranchCache


class Stepper:
    """The transformer of this rank and where it sits in its replica's parallel layout."""

    def __init__(self, transformer: FluxTransformer, parallel: ParallelContext, device: torch.device) -> None:
        self.transformer = transformer
        self.parallel = parallel
        self.device = device

    @torch.inference_mode()
    def unshard(self, latents: Tensor) -> Tensor:
        """The full latents from the Ulysses shards (one all_gather per batch), on every rank of the group."""
        if self.parallel.ulysses_size == 1:
            return latents
        shards = all_gather_into(latents, self.parallel.ulysses_group, self.transformer.counters)
        return torch.cat(shards.unbind(0), dim=1)

    @torch.inference_mode()
    def step(self, x: Tensor, cond: Conditioning, sigmas: Tensor, timesteps: Tensor, steps: list[int],
                      guidance_scale: float,
                      caches: tuple[BranchCache | None, BranchCache | None] = (None, None)) -> Tensor:
        """One Euler step of every row, each at its own step index ``steps[row]``."""
        i = torch.tensor(steps, device=x.device)
        # As diffusers: the timestep (sigma * 1000) goes to the model dtype, then back to [0, 1].
        t = timesteps[i].to(x.dtype) / 1000
        guidance = None
        if self.transformer.params.guidance_embed:
            guidance = torch.full((x.shape[0],), guidance_scale, device=self.device, dtype=torch.float32)
        pred = self.velocity(caches[0], steps, x, cond.txt, t, cond.vec, guidance, cond.pe, cond.ref)
        if cond.cfg_split:
            # One exchange per step; every rank combines the same two tensors in the same order, so
            # the latents stay identical on all ranks (and equal to the single-rank result).
            pred, neg = all_gather_into(pred, self.parallel.cfg_group, self.transformer.counters).unbind(0)
            pred = neg + cond.cfg_scale * (pred - neg)
        elif cond.neg_txt is not None and cond.neg_vec is not None:
            neg = self.velocity(caches[1], steps, x, cond.neg_txt, t, cond.neg_vec, guidance, cond.pe, cond.ref)
            pred = neg + cond.cfg_scale * (pred - neg)
        return euler_step(x, pred, sigmas[i].view(-1, 1, 1), sigmas[i + 1].view(-1, 1, 1))

    def velocity(self, cache: BranchCache | None, steps: list[int], x: Tensor, txt: Tensor, t: Tensor, vec: Tensor,
                  guidance: Tensor | None, pe: Tensor, ref: Tensor | None = None) -> Tensor:
        tokens = x.shape[1]
        if ref is not None:  # Kontext: the reference's tokens ride along; only the image's velocity is kept
            x = torch.cat([x, ref], dim=1)
        if cache is None:
            return self.transformer(x, None, txt, None, t, vec, guidance, pe=pe)[:, :tokens]
        return cached_velocity(self.transformer, cache, steps, x, txt, t, vec, guidance, pe)[:, :tokens]
