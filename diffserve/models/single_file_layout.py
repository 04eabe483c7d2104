"""Which layout a single-file component is in (diffusers', BFL's, ComfyUI's...) and the
prefix its tensors sit under, by component: the detectors live with the readers that
load each (the FLUX transformer's in ``flux/checkpoint_layouts.py``, the text encoders'
and the VAE's beside their file readers). ``diffserve models inspect`` asks here, so a
command names no family."""

from __future__ import annotations


def component_layout(name: str, keys: list[str], source: str) -> tuple[str, str]:
    """A single file's layout, and the prefix its component's tensors sit under (ComfyUI
    bundles several)."""
    if name == "transformer":
        from diffserve.models.flux.checkpoint_layouts import (
            COMFYUI_PREFIX,
            detect_layout,
        )

        layout = detect_layout(keys, source)
        return layout, COMFYUI_PREFIX if layout == "comfyui" else ""
    if name in ("text_encoder", "text_encoder_2"):
        from diffserve.models.text_encoder_file import (
            TEXT_ENCODER_FILES,
            text_encoder_layout,
        )

        layout = text_encoder_layout(name, keys, source)
        return layout, TEXT_ENCODER_FILES[
            name
        ].comfyui_prefix if layout == "comfyui" else ""
    from diffserve.models.vae_file import COMFYUI_VAE_PREFIX, vae_layout

    layout = vae_layout(keys, source)
    return layout, COMFYUI_VAE_PREFIX if layout == "comfyui" else ""
