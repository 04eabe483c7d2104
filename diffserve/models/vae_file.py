"""The VAE: from the model's ``vae/`` folder, or from one file (``components: {vae:
FILE}``) in the diffusers layout, the original latent-diffusion layout of Black Forest
Labs' ``ae.safetensors``, or ComfyUI's (the same under ``first_stage_model.``, possibly
beside other components). The folder's ``config.json`` describes the architecture either
way; the weights are checked strictly (every key, every shape), naming the file.
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
    """``diffusers`` | ``ldm`` | ``comfyui``; anything else is a ModelLoadError saying
    what the keys look like."""
    if any(k.startswith(COMFYUI_VAE_PREFIX + "encoder.down.") for k in keys):
        return "comfyui"
    if any(k.startswith("encoder.down.") for k in keys):
        return "ldm"
    if any(k.startswith("encoder.down_blocks.") for k in keys):
        return "diffusers"
    raise ModelLoadError(
        f"{source}: {looks_like(keys)}, expected a VAE (diffusers "
        "`encoder.down_blocks.N...`, "
        "BFL/latent-diffusion `encoder.down.N.block...` as "
        "in ae.safetensors, or ComfyUI "
        "`first_stage_model.encoder.down...`)"
    )


def load_vae(
    vae_dir: str | Path,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    weights_file: str | None = None,
) -> Any:
    """diffusers' ``AutoencoderKL`` for ``vae_dir``'s config, with the folder's weights
    or ``weights_file``'s."""
    from diffusers import AutoencoderKL

    if weights_file is None:
        try:
            # use_safetensors=True: diffusers would otherwise fall back to unpickling a
            # .bin file.
            return (
                strict_from_pretrained(AutoencoderKL, vae_dir, torch_dtype=dtype)
                .to(device)
                .eval()
            )
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the VAE from {vae_dir}: {exc}") from exc
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    config = read_config(vae_dir)
    tensors = read_checkpoint(weights_file)
    layout = vae_layout(list(tensors), weights_file)
    prefix = COMFYUI_VAE_PREFIX if layout == "comfyui" else ""
    if layout == "comfyui":
        tensors = {
            k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)
        }
    names: dict[str, str] = {}
    dropped: list[str] = []
    if layout != "diffusers":
        names = converted_names(list(tensors), config)
        # Unknown to the converter.
        dropped = sorted(prefix + key for key in tensors.keys() - set(names.values()))
        tensors = convert_ldm_vae_checkpoint(tensors, config)
    with torch.device("meta"):
        vae = AutoencoderKL.from_config(config)

    def file_key(
        key: str,
    ) -> str:  # errors name keys as the file does: a converted name is not in it
        found = file_name(key, names)
        return f"{key} (diffusers' name)" if found is None else prefix + found

    load_strict(
        vae,
        tensors,
        dtype=dtype,
        device=device,
        source=weights_file,
        file_key=file_key if layout != "diffusers" else None,
        dropped=dropped,
    )
    logger.info("loaded the VAE from %s (%s layout)", weights_file, layout)
    return vae.eval()


def converted_names(keys: list[str], config: dict) -> dict[str, str]:
    """diffusers key -> the latent-diffusion key diffusers'
    ``convert_ldm_vae_checkpoint`` makes it from, learnt by converting one-element
    tensors that carry each key's index (its renaming rules stay its own)."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    # 4-D, as the attention weights it reshapes from 1x1 convolutions are; float32 holds
    # every index exactly.
    probe = {key: torch.full((1, 1, 1, 1), float(i)) for i, key in enumerate(keys)}
    return {
        new: keys[int(tag.reshape(-1)[0])]
        for new, tag in convert_ldm_vae_checkpoint(probe, config).items()
    }


def file_name(key: str, names: dict[str, str]) -> str | None:
    """The file's name for diffusers ``key``; for one the file lacks, derived from its
    ``.weight``/``.bias`` sibling's (None when that is missing too)."""
    if key in names:
        return names[key]
    stem, _, suffix = key.rpartition(".")
    for other in ("weight", "bias"):
        sibling = names.get(f"{stem}.{other}")
        if other != suffix and sibling is not None and sibling.endswith(f".{other}"):
            return sibling[: -len(other)] + suffix
    return None
