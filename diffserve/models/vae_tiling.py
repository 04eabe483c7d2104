"""VAE tiling: decode a large image in overlapping tiles blended at the seams
(diffusers' ``AutoencoderKL`` tiled decode), so the decoder's full-resolution
activations and its mid-block attention over every latent position never exist at once.
Which images are tiled is the stage's ``vae`` section (config/schema.py: ``tiling`` auto
| on | off, ``tiling_min_pixels``, ``tile_size``); neighbouring tiles overlap by a
quarter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from diffserve.config.stage_sections import VaeConfig

TILE_OVERLAP = 0.25  # diffusers' default blend: a quarter of a tile on each shared edge


def configure_tiling(vae: Any, config: VaeConfig) -> None:
    """Give ``vae`` the stage's tile size (diffusers' default is the config's
    ``sample_size``, 1024 for FLUX's VAE, which would tile nothing up to 1024x1024).
    Tiling stays off until ``decode_tiled`` says. Wan-layout VAEs (``AutoencoderKLWan``,
    ``AutoencoderKLQwenImage``) name their tiles by height, width and stride in pixels;
    the same size and overlap go there."""
    vae.use_tiling = False
    if hasattr(vae, "tile_sample_min_height"):
        stride = int(config.tile_size * (1.0 - TILE_OVERLAP))
        vae.tile_sample_min_height = vae.tile_sample_min_width = config.tile_size
        vae.tile_sample_stride_height = vae.tile_sample_stride_width = stride
        return
    downscale = 2 ** (len(vae.config.block_out_channels) - 1)
    vae.tile_sample_min_size = config.tile_size
    vae.tile_latent_min_size = config.tile_size // downscale
    vae.tile_overlap_factor = TILE_OVERLAP


def wants_tiling(config: VaeConfig, height: int, width: int) -> bool:
    """Whether images of ``height`` x ``width`` are decoded in tiles (only images larger
    than one tile are)."""
    if config.tiling == "off" or max(height, width) <= config.tile_size:
        return False
    return config.tiling == "on" or height * width >= config.tiling_min_pixels


@contextmanager
def tiling(vae: Any, config: VaeConfig, height: int, width: int) -> Iterator[bool]:
    """Within the block, ``vae`` decodes images of this size tiled or not, as the stage
    says (yields which); after it, tiling is off again, so an edit's VAE encode is never
    tiled by a decode's setting."""
    vae.use_tiling = wants_tiling(config, height, width)
    try:
        yield bool(vae.use_tiling)
    finally:
        vae.use_tiling = False
