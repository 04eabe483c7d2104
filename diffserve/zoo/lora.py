"""``make-model tiny-flux-lora DIR --base MODEL``: a random LoRA for a FLUX model, in
the diffusers/PEFT layout (``transformer.<module>.lora_A.weight`` / ``.lora_B.weight``)
that ``FluxPipeline.load_lora_weights`` reads, written to
``DIR/pytorch_lora_weights.safetensors`` (diffusers' default name). Seeded and
deterministic; nothing is downloaded.

It targets the attention projections and MLP outputs of every block, the first double
block's image modulation (a layer on per-sample vectors) and the final modulation (whose
halves the native layout swaps), so every mapping of ``models/flux/lora_file.py`` is
exercised.
"""

from __future__ import annotations

import json
from pathlib import Path

from diffserve.errors import ConfigError
from diffserve.zoo.components import component_seed

WEIGHT_NAME = "pytorch_lora_weights.safetensors"
_DOUBLE = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "ff.net.2",
)
_SINGLE = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out")


def build_flux_lora(
    base_dir: str | Path,
    out_dir: str | Path,
    *,
    seed: int = 0,
    rank: int = 4,
    strength: float = 0.5,
    force: bool = False,
) -> Path:
    """Write a random rank-``rank`` LoRA for the FLUX model at ``base_dir``; returns the
    file's path."""
    import torch
    from safetensors.torch import save_file

    base = Path(base_dir).expanduser()
    try:
        config = json.loads(
            (base / "transformer" / "config.json").read_text(encoding="utf-8")
        )
        index = json.loads((base / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{base} is not a FLUX model directory ({exc})",
            path="--base",
            hint="pass the directory made by make-model tiny-flux (or any FLUX model)",
        ) from None
    if index.get("_class_name") != "FluxPipeline":
        raise ConfigError(
            f"{base} holds a {index.get('_class_name')}, not a FluxPipeline",
            path="--base",
        )
    if not isinstance(rank, int) or rank < 1:
        raise ConfigError(
            f"rank must be a positive integer, got {rank!r}", path="--rank"
        )
    out = Path(out_dir).expanduser()
    target = out / WEIGHT_NAME
    if target.exists() and not force:
        raise ConfigError(
            f"{target} exists",
            path="DIR",
            hint="choose another directory or pass --force",
        )
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    shapes = {
        "attn.to_q": (hidden, hidden),
        "attn.to_k": (hidden, hidden),
        "attn.to_v": (hidden, hidden),
        "attn.to_out.0": (hidden, hidden),
        "attn.add_q_proj": (hidden, hidden),
        "ff.net.2": (hidden, 4 * hidden),
        "proj_mlp": (4 * hidden, hidden),
        "proj_out": (hidden, 5 * hidden),
    }
    modules = [
        (f"transformer_blocks.{i}.{m}", shapes[m])
        for i in range(config["num_layers"])
        for m in _DOUBLE
    ]
    modules += [
        (f"single_transformer_blocks.{i}.{m}", shapes[m])
        for i in range(config["num_single_layers"])
        for m in _SINGLE
    ]
    modules += [
        ("transformer_blocks.0.norm1.linear", (6 * hidden, hidden)),
        ("norm_out.linear", (2 * hidden, hidden)),
    ]
    generator = torch.Generator().manual_seed(component_seed(seed, "lora"))
    tensors = {}
    for name, (out_features, in_features) in modules:
        tensors[f"transformer.{name}.lora_A.weight"] = (
            torch.randn(rank, in_features, generator=generator) / in_features**0.5
        )
        tensors[f"transformer.{name}.lora_B.weight"] = (
            torch.randn(out_features, rank, generator=generator) * strength / rank**0.5
        )
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in sorted(tensors.items())},
        str(target),
        metadata={"format": "pt"},
    )
    return target
