"""Write a diffusers-format FLUX transformer as the single files users download: Black
Forest Labs' layout (``flux1-dev.safetensors``: ``double_blocks.N.img_attn.qkv.weight``,
...) and ComfyUI's (the same names under ``model.diffusion_model.``, possibly beside a
bundled VAE and text encoders).

Written from diffusers' names directly (not from diffserve's loader), so a test can
check this converter against diffusers'
``convert_flux_transformer_checkpoint_to_diffusers`` in the other direction and then
load the files through diffserve: three independent mappings that must agree.
"""

from __future__ import annotations

from pathlib import Path

from diffserve.logging import get_logger

logger = get_logger(__name__)

COMFYUI_PREFIX = "model.diffusion_model."
# Diffusers module -> BFL module (weight and bias alike)
_PLAIN = {
    "x_embedder": "img_in",
    "context_embedder": "txt_in",
    "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
    "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
    "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
    "proj_out": "final_layer.linear",
}
_DOUBLE = {
    "norm1.linear": "img_mod.lin",
    "norm1_context.linear": "txt_mod.lin",
    "attn.to_out.0": "img_attn.proj",
    "attn.to_add_out": "txt_attn.proj",
    "ff.net.0.proj": "img_mlp.0",
    "ff.net.2": "img_mlp.2",
    "ff_context.net.0.proj": "txt_mlp.0",
    "ff_context.net.2": "txt_mlp.2",
}
_DOUBLE_NORMS = {
    "attn.norm_q": "img_attn.norm.query_norm",
    "attn.norm_k": "img_attn.norm.key_norm",
    "attn.norm_added_q": "txt_attn.norm.query_norm",
    "attn.norm_added_k": "txt_attn.norm.key_norm",
}
_SINGLE = {"proj_out": "linear2", "norm.linear": "modulation.lin"}
_SINGLE_NORMS = {"attn.norm_q": "norm.query_norm", "attn.norm_k": "norm.key_norm"}


def diffusers_to_bfl(state_dict: dict) -> dict:
    """A diffusers ``FluxTransformer2DModel`` state dict in BFL's names (tensors shared
    or concatenated)."""
    import torch

    sd = dict(state_dict)
    out: dict = {}

    def take(src: str, dst: str) -> None:
        for suffix in ("weight", "bias"):
            if f"{src}.{suffix}" in sd:
                out[f"{dst}.{suffix}"] = sd.pop(f"{src}.{suffix}")

    def fuse(sources: list[str], dst: str) -> None:
        for suffix in ("weight", "bias"):
            out[f"{dst}.{suffix}"] = torch.cat(
                [sd.pop(f"{s}.{suffix}") for s in sources], dim=0
            )

    for src, dst in _PLAIN.items():
        take(src, dst)
    # Diffusers (scale, shift); BFL (shift, scale)
    scale, shift = sd.pop("norm_out.linear.weight").chunk(2, dim=0)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat((shift, scale), dim=0)
    scale, shift = sd.pop("norm_out.linear.bias").chunk(2, dim=0)
    out["final_layer.adaLN_modulation.1.bias"] = torch.cat((shift, scale), dim=0)

    def block(d: str, b: str, plain: dict[str, str], norms: dict[str, str]) -> None:
        for src, dst in plain.items():
            take(f"{d}.{src}", f"{b}.{dst}")
        for src, dst in norms.items():
            out[f"{b}.{dst}.scale"] = sd.pop(f"{d}.{src}.weight")

    for i in sorted(
        {int(k.split(".")[1]) for k in sd if k.startswith("transformer_blocks.")}
    ):
        d, b = f"transformer_blocks.{i}", f"double_blocks.{i}"
        block(d, b, _DOUBLE, _DOUBLE_NORMS)
        fuse(
            [f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v"], f"{b}.img_attn.qkv"
        )
        fuse(
            [f"{d}.attn.add_q_proj", f"{d}.attn.add_k_proj", f"{d}.attn.add_v_proj"],
            f"{b}.txt_attn.qkv",
        )
    for i in sorted(
        {int(k.split(".")[1]) for k in sd if k.startswith("single_transformer_blocks.")}
    ):
        d, b = f"single_transformer_blocks.{i}", f"single_blocks.{i}"
        block(d, b, _SINGLE, _SINGLE_NORMS)
        fuse(
            [f"{d}.attn.to_q", f"{d}.attn.to_k", f"{d}.attn.to_v", f"{d}.proj_mlp"],
            f"{b}.linear1",
        )
    if sd:
        raise ValueError(
            f"diffusers keys this converter does not know: {sorted(sd)[:10]}"
        )
    return out


def write_single_file(
    model_dir: str | Path,
    path: str | Path,
    layout: str = "bfl",
    bundled: dict | None = None,
) -> Path:
    """``model_dir``'s transformer as one safetensors file in ``layout`` (``bfl`` |
    ``comfyui``); a ComfyUI file may carry ``bundled`` tensors of other components
    (their keys as given, e.g. ``first_stage_model.``)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(
        str(Path(model_dir) / "transformer" / "diffusion_pytorch_model.safetensors")
    )
    tensors = {k: v.contiguous() for k, v in diffusers_to_bfl(weights).items()}
    if layout == "comfyui":
        tensors = {COMFYUI_PREFIX + k: v for k, v in tensors.items()} | dict(
            bundled or {}
        )
    elif layout != "bfl":
        raise ValueError(f"layout must be bfl or comfyui, got {layout!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target))
    logger.info("wrote %s (%s layout, %d tensors)", target, layout, len(tensors))
    return target


def write_gguf(model_dir: str | Path, path: str | Path, qtype: str = "q8_0") -> Path:
    """``model_dir``'s transformer as a GGUF file in city96's FLUX layout (BFL names,
    architecture ``flux``): 2-D weights whose input size is a multiple of 32 in
    ``qtype`` (ggml's block format, quantized by the ``gguf`` package), everything else
    float32."""
    import gguf
    from safetensors.torch import load_file

    kind = gguf.GGMLQuantizationType[qtype.upper()]
    weights = load_file(
        str(Path(model_dir) / "transformer" / "diffusion_pytorch_model.safetensors")
    )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(target), "flux")
    for name, tensor in sorted(diffusers_to_bfl(weights).items()):
        array = tensor.float().numpy()
        if array.ndim == 2 and array.shape[1] % 32 == 0:
            writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    logger.info("wrote %s (GGUF %s)", target, qtype)
    return target
