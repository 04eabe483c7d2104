"""One Wan transformer call through First-Block Cache (``models/stepcache``): block 0 always runs and its
residual is the probe; the rows that skip reuse the cached residual of the other blocks on top of block 0's
output. The embeddings and the head always run, for every row. When every row computes this is the fused
``WanTransformer.forward``, op for op, so the video equals an uncached run bit for bit.

TeaCache is not offered on Wan: TeaCache4Wan2.1's polynomials are fitted per checkpoint size (1.3B, 14B) on
another probe (the timestep projection), so they say nothing about other sizes; the stage refuses it by name."""

from __future__ import annotations

from torch import Tensor

from diffserve.models.stepcache.policy import BranchCache
from diffserve.models.wan.transformer import WanTransformer


def cached_forward(transformer: WanTransformer, cache: BranchCache, steps: list[int], latents: Tensor,
                   timesteps: Tensor, text: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
    """The velocity for every row of ``latents``, row ``r`` at denoise step ``steps[r]`` (0-based), as
    ``transformer(...)`` returns it."""
    x, temb, modulation, context = transformer.embed(latents, timesteps, text)
    base = transformer.blocks[0](x, context, modulation, rope)
    compute = cache.decide(steps, base - x)
    if any(compute):
        transformer.counters.count_forward()  # a full forward (for the computing rows); skips do not count

    def run_blocks(rows: Tensor | None) -> Tensor:
        if rows is None:
            return transformer.run_blocks(base, context, modulation, rope, start=1)
        return transformer.run_blocks(base[rows], context[rows], modulation[rows], rope, start=1)

    return transformer.head(cache.apply(compute, base, run_blocks), temb, transformer.token_grid(latents))
