"""One FLUX transformer call through a step cache (``models/stepcache``): the probe, the
decision per row, and the blocks run only for the rows that compute.

- fbcache: block 0 always runs; its image residual is the probe; skipping rows reuse the
  cached residual
  of the remaining blocks on top of block 0's output.
- teacache: block 0's modulated input is the probe (no block runs for it); skipping rows
  reuse the cached
  residual of all blocks on top of the embedded image tokens.
The embeddings and the final layer always run, for every row. When every row computes
this is the fused ``FluxTransformer.forward``, op for op, so the images equal an
uncached run bit for bit.
"""

from __future__ import annotations

from torch import Tensor

from diffserve.models.flux.transformer import FluxTransformer
from diffserve.models.stepcache.policy import BranchCache


def cached_velocity(
    transformer: FluxTransformer,
    cache: BranchCache,
    steps: list[int],
    x: Tensor,
    txt: Tensor,
    timesteps: Tensor,
    y: Tensor,
    guidance: Tensor | None,
    pe: Tensor,
) -> Tensor:
    """The velocity for every row of ``x``, row ``r`` at denoise step ``steps[r]``
    (0-based), as ``transformer(...)`` returns it."""
    img, txt, vec = transformer.embed(x, txt, timesteps, y, guidance)
    if cache.settings.backend == "fbcache":
        base, txt, start = *transformer.first_block(img, txt, vec, pe), 1
        compute = cache.decide(steps, base - img)
    else:
        base, start = img, 0
        compute = cache.decide(steps, transformer.modulated_input(img, vec))
    if any(compute):
        # a full forward (for the computing rows); skips do not count
        transformer.counters.count_forward()

    def run_blocks(rows: Tensor | None) -> Tensor:
        if rows is None:
            return transformer.blocks(base, txt, vec, pe, start)
        return transformer.blocks(base[rows], txt[rows], vec[rows], pe, start)

    return transformer.head(cache.apply(compute, base, run_blocks), vec)
