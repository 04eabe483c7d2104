"""One Wan transformer call through a step cache (``models/stepcache``): the probe, the
decision per row, and the blocks run only for the rows that compute.

- fbcache: block 0 always runs; its residual is the probe; skipping rows reuse the
  cached residual of the
  other blocks on top of block 0's output.
- teacache (TeaCache4Wan2.1): the probe is the timestep embedding or the timestep
  modulation, as the published
  polynomial was fitted (``registry/teacache.py``); no block runs for it, and skipping
  rows reuse the cached residual of all blocks on top of the embedded video tokens.
The embeddings and the head always run, for every row. When every row computes this is
the fused ``WanTransformer.forward``, op for op, so the video equals an uncached run bit
for bit.
"""

from __future__ import annotations

from torch import Tensor

from diffserve.models.stepcache.policy import BranchCache
from diffserve.models.wan.transformer import WanTransformer


def cached_forward(
    transformer: WanTransformer,
    cache: BranchCache,
    steps: list[int],
    latents: Tensor,
    timesteps: Tensor,
    text: Tensor,
    rope: tuple[Tensor, Tensor],
    teacache_probe: str | None = None,
) -> Tensor:
    """The velocity for every row of ``latents``, row ``r`` at denoise step ``steps[r]``
    (0-based), as ``transformer(...)`` returns it. ``teacache_probe`` names TeaCache's
    probe (``timestep_embedding`` or ``timestep_modulation``); ``None`` runs First-Block
    Cache."""
    x, temb, modulation, context = transformer.embed(latents, timesteps, text)
    if teacache_probe is None:
        base, start = transformer.blocks[0](x, context, modulation, rope), 1
        compute = cache.decide(steps, base - x)
    else:
        base, start = x, 0
        compute = cache.decide(
            steps, temb if teacache_probe == "timestep_embedding" else modulation
        )
    if any(compute):
        # a full forward (for the computing rows); skips do not count
        transformer.counters.count_forward()

    def run_blocks(rows: Tensor | None) -> Tensor:
        if rows is None:
            return transformer.run_blocks(base, context, modulation, rope, start=start)
        return transformer.run_blocks(
            base[rows], context[rows], modulation[rows], rope, start=start
        )

    return transformer.head(
        cache.apply(compute, base, run_blocks), temb, transformer.token_grid(latents)
    )
