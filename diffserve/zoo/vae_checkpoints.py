"""Write a diffusers-format ``AutoencoderKL`` as the single VAE file users download: the
original latent-diffusion layout that Black Forest Labs' ``ae.safetensors`` uses
(``encoder.down.0.block.0.conv1.weight``, ..., ``decoder.up.N`` numbered from the lowest
resolution, attention as 1x1 convolutions), optionally under ComfyUI's
``first_stage_model.`` prefix.

Written from diffusers' names directly, so a test can check it against diffusers'
``convert_ldm_vae_checkpoint`` in the other direction (flux_checkpoints.py does the same
for the transformer).
"""

from __future__ import annotations

import re
from pathlib import Path

from diffserve.logging import get_logger

logger = get_logger(__name__)

COMFYUI_VAE_PREFIX = "first_stage_model."
_ATTENTION = {
    "group_norm": "norm",
    "to_q": "q",
    "to_k": "k",
    "to_v": "v",
    "to_out.0": "proj_out",
}


def _resnet(name: str) -> str:
    return name.replace("conv_shortcut", "nin_shortcut")


def _rename(key: str, up_blocks: int) -> str:
    """One diffusers key -> its latent-diffusion name."""
    if m := re.match(r"^(encoder|decoder)\.mid_block\.resnets\.(\d)\.(.+)$", key):
        return f"{m[1]}.mid.block_{int(m[2]) + 1}.{_resnet(m[3])}"
    if m := re.match(
        r"^(encoder|decoder)\.mid_block\.attentions\.0\.(group_norm|to_q|to_k|to_v|to_out\.0)\.(.+)$",
        key,
    ):
        return f"{m[1]}.mid.attn_1.{_ATTENTION[m[2]]}.{m[3]}"
    if m := re.match(r"^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.+)$", key):
        return f"encoder.down.{m[1]}.block.{m[2]}.{_resnet(m[3])}"
    if m := re.match(
        r"^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.+)$", key
    ):
        return f"encoder.down.{m[1]}.downsample.conv.{m[2]}"
    # diffusers counts the decoder's up blocks from the lowest resolution's end; the
    # original from the other.
    if m := re.match(r"^decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)$", key):
        return f"decoder.up.{up_blocks - 1 - int(m[1])}.block.{m[2]}.{_resnet(m[3])}"
    if m := re.match(r"^decoder\.up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.+)$", key):
        return f"decoder.up.{up_blocks - 1 - int(m[1])}.upsample.conv.{m[2]}"
    if m := re.match(r"^(encoder|decoder)\.conv_norm_out\.(.+)$", key):
        return f"{m[1]}.norm_out.{m[2]}"
    if re.match(r"^(encoder|decoder)\.conv_(in|out)\.|^(post_)?quant_conv\.", key):
        return key
    raise ValueError(f"diffusers VAE key this converter does not know: {key}")


def diffusers_vae_to_ldm(state_dict: dict) -> dict:
    """A diffusers ``AutoencoderKL`` state dict in the latent-diffusion names (attention
    weights as 1x1 convs)."""
    up_blocks = len(
        {int(k.split(".")[2]) for k in state_dict if k.startswith("decoder.up_blocks.")}
    )
    out = {}
    for key, tensor in state_dict.items():
        name = _rename(key, up_blocks)
        if ".mid.attn_1." in name and name.endswith(".weight") and tensor.ndim == 2:
            tensor = tensor[:, :, None, None]
        out[name] = tensor
    return out


def write_vae_file(model_dir: str | Path, path: str | Path, prefix: str = "") -> Path:
    """``model_dir``'s VAE as one safetensors file in the latent-diffusion layout
    (``prefix``: e.g. ComfyUI's)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(
        str(Path(model_dir) / "vae" / "diffusion_pytorch_model.safetensors")
    )
    tensors = {
        prefix + k: v.contiguous() for k, v in diffusers_vae_to_ldm(weights).items()
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target))
    logger.info(
        "wrote %s (latent-diffusion VAE layout, %d tensors)", target, len(tensors)
    )
    return target
