"""The VAE: from the model's ``vae/`` folder, or from one file (``components: {vae: FILE}``) in the diffusers
layout, the original latent-diffusion layout of Black Forest Labs' ``ae.safetensors``, or ComfyUI's (the same
under ``first_stage_model.``, possibly beside other components). The folder's ``config.json`` describes the
architecture either way; the weights are checked strictly (every key, every shape), naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from diffserve.errors import ModelLoadError
from diffserve.logging import get_logger
from diffserve.models.loader import (
    load_strict,
    looks_like,
    read_checkpoint,
    read_config,
    strict_from_pretrained,
)

logger = get_logger(__name__)

COMFYUI_VAE_PREFIX = "first_stage_model."


def vae_layout(keys: list[str], source: str) -> str:
    """``diffusers`` | ``ldm`` | ``comfyui``; anything else is a ModelLoadError saying what the keys look like."""
    if any(k.startswith(COMFYUI_VAE_PREFIX + "encoder.down.") for k in keys):
        return "comfyui"
    if any(k.startswith("encoder.down.") for k in keys):
        return "ldm"
    if any(k.startswith("encoder.down_blocks.") for k in keys):
        return "diffusers"
    raise ModelLoadError(f"{source}: {looks_like(keys)}, expected a VAE (diffusers `encoder.down_blocks.N...`, "
                         "BFL/latent-diffusion `encoder.down.N.block...` as in ae.safetensors, or ComfyUI "
                         "`first_stage_model.encoder.down...`)")


def load_vae(vae_dir: str | Path, *, dtype: torch.dtype, device: torch.device | str,
             weights_file: str | None = None) -> Any:
    """diffusers' ``AutoencoderKL`` for ``vae_dir``'s config, with the folder's weights or ``weights_file``'s."""
    from diffusers import AutoencoderKL

    if weights_file is None:
        try:
            # use_safetensors=True: diffusers would otherwise fall back to unpickling a .bin file.
            return strict_from_pretrained(AutoencoderKL, vae_dir, torch_dtype=dtype).to(device).eval()
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the VAE from {vae_dir}: {exc}") from exc
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    config = read_config(vae_dir)
    tensors = read_checkpoint(weights_file)
    layout = vae_layout(list(tensors), weights_file)
    if layout == "comfyui":
        tensors = {k[len(COMFYUI_VAE_PREFIX):]: v for k, v in tensors.items() if k.startswith(COMFYUI_VAE_PREFIX)}
    if layout != "diffusers":
        given = len(tensors)
        tensors = convert_ldm_vae_checkpoint(tensors, config)
        if len(tensors) != given:  # diffusers' converter skips the names it does not know
            raise ModelLoadError(f"{weights_file}: {given - len(tensors)} of its {given} VAE tensors are not part of "
                                 "this VAE's architecture (a checkpoint of another model?)")
    with torch.device("meta"):
        vae = AutoencoderKL.from_config(config)
    load_strict(vae, tensors, dtype=dtype, device=device, source=weights_file)
    logger.info("loaded the VAE from %s (%s layout)", weights_file, layout)
    return vae.eval()
