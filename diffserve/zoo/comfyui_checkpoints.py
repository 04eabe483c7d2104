"""Write a diffusers-format FLUX model's text encoders as the single files ComfyUI users
hold: ``clip_l.safetensors`` (transformers' names under ``text_model.``, with CLIP's
``text_projection``, which FLUX does not use) and ``t5xxl_fp16.safetensors``
(``encoder.block.N...`` and ``shared.weight``, the tied ``encoder.embed_tokens`` left
out), and the whole model as one ComfyUI all-in-one checkpoint (transformer under
``model.diffusion_model.``, VAE under ``first_stage_model.``, text encoders under
``text_encoders.clip_l.transformer.`` and ``text_encoders.t5xxl.transformer.``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffserve.logging import get_logger
from diffserve.zoo.flux_checkpoints import write_single_file
from diffserve.zoo.vae_checkpoints import COMFYUI_VAE_PREFIX, diffusers_vae_to_ldm

logger = get_logger(__name__)

COMFYUI_TEXT_ENCODER_PREFIXES = {
    "text_encoder": "text_encoders.clip_l.transformer.",
    "text_encoder_2": "text_encoders.t5xxl.transformer.",
}


def text_encoder_tensors(model_dir: str | Path, component: str) -> dict[str, Any]:
    """``component``'s weights (``text_encoder``: CLIP-L, ``text_encoder_2``: T5) as
    standalone files name them."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(Path(model_dir) / component / "model.safetensors"))
    if component == "text_encoder":
        # transformers 5 saves CLIPTextModel without its ``text_model.`` level; released
        # files have it.
        named = {
            k if k.startswith("text_model.") else f"text_model.{k}": v
            for k, v in weights.items()
        }
        width = named["text_model.final_layer_norm.weight"].shape[0]
        generator = torch.Generator().manual_seed(0)
        named["text_projection.weight"] = torch.randn(width, width, generator=generator)
        return named
    if component == "text_encoder_2":
        return {k: v for k, v in weights.items() if k != "encoder.embed_tokens.weight"}
    raise ValueError(
        f"component must be text_encoder or text_encoder_2, got {component!r}"
    )


def write_text_encoder_file(
    model_dir: str | Path, component: str, path: str | Path
) -> Path:
    """One text encoder of ``model_dir`` as a standalone safetensors file (clip_l /
    t5xxl style)."""
    from safetensors.torch import save_file

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            k: v.contiguous()
            for k, v in text_encoder_tensors(model_dir, component).items()
        },
        str(target),
    )
    logger.info("wrote %s (%s, standalone layout)", target, component)
    return target


def write_comfyui_bundle(model_dir: str | Path, path: str | Path) -> Path:
    """The whole of ``model_dir`` (transformer, VAE, both text encoders) as one ComfyUI
    all-in-one checkpoint."""
    from safetensors.torch import load_file

    vae = load_file(
        str(Path(model_dir) / "vae" / "diffusion_pytorch_model.safetensors")
    )
    bundled = {
        COMFYUI_VAE_PREFIX + k: v.contiguous()
        for k, v in diffusers_vae_to_ldm(vae).items()
    }
    for component, prefix in COMFYUI_TEXT_ENCODER_PREFIXES.items():
        bundled |= {
            prefix + k: v.contiguous()
            for k, v in text_encoder_tensors(model_dir, component).items()
        }
    return write_single_file(model_dir, path, layout="comfyui", bundled=bundled)
