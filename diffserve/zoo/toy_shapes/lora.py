"""Train "circles-to-stars", a LoRA for the toy-shapes model that draws a star wherever
a prompt says circle.

A visible, checkable adapter effect for tests and demos: with it, "a red circle on a
blue background" comes out as a red star; every other prompt keeps its drawing. The base
model (VAE, text encoders, transformer) is frozen; low-rank factors on the transformer's
attention projections and MLPs (both streams) learn the same flow-matching loss as the
base training (``train.flow_matching_loss``) on procedurally drawn pairs: circle prompts
with star images of the same colours and layout, and, to keep the rest, every other
prompt with its own image. About a minute on a 2-core CPU.

The adapter is written in the diffusers/PEFT layout
(``transformer.<module>.lora_A.weight`` / ``.lora_B.weight``, the scaling folded into
``B``), which diffserve's ``loras`` and ``FluxPipeline.load_lora_weights`` both read.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from diffserve.logging import get_logger
from diffserve.zoo.components import component_seed
from diffserve.zoo.publish import build_into
from diffserve.zoo.toy_shapes.flow import optimizer_step, pack
from diffserve.zoo.toy_shapes.grammar import Scene, all_scenes, draw
from diffserve.zoo.toy_shapes.loss_curve import write_loss_curve
from diffserve.zoo.toy_shapes.train import (
    encode_images,
    encode_prompts,
    images_to_tensor,
)

logger = get_logger(__name__)

# Diffserve/assets/toy-shapes-stars: the shipped adapter.
STARS_ASSET = "toy-shapes-stars"
WEIGHT_NAME = "pytorch_lora_weights.safetensors"  # diffusers' default adapter file name
# diffusers module names of the adapted layers, per block kind (image and text streams
# of the double blocks).
DOUBLE_TARGETS = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
)
SINGLE_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out")


@dataclass(frozen=True)
class LoraTrainConfig:
    """The adapter's training budget; the defaults made the shipped adapter."""

    # on toy-shapes version 2, seeds 0-2 all left 4 of 16 circles; 1 drew the most stars
    # (12)
    seed: int = 1
    images: int = 2048  # drawn training pairs (latents encoded once)
    # of the pairs: circle prompts drawn as stars; the rest keep their own drawing
    circle_share: float = 0.5
    steps: int = 400
    batch: int = 32
    lr: float = 3e-3
    rank: int = 8
    threads: int = 2
    bf16: bool = True


def shipped_stars_lora() -> Path:
    """The shipped circles-to-stars adapter file
    (``diffserve/assets/toy-shapes-stars``)."""
    from diffserve.errors import ConfigError

    path = Path(__file__).resolve().parents[2] / "assets" / STARS_ASSET / WEIGHT_NAME
    if not path.is_file():
        raise ConfigError(
            f"the shipped circles-to-stars LoRA is missing: {path}",
            path="lora",
            hint="reinstall diffserve, or train it: diffserve make-model "
            "toy-shapes-stars DIR --train",
        )
    return path


def star_target(scene: Scene) -> Scene:
    """What the adapter should draw for ``scene``: a star where the prompt says circle,
    else the scene."""
    return replace(scene, shape="star") if scene.shape == "circle" else scene


def train_stars_lora(
    out_dir: Path | str,
    base: Path | str,
    config: LoraTrainConfig = LoraTrainConfig(),
    *,
    force: bool = False,
) -> Path:
    """Train the adapter for the toy-shapes model at ``base`` into ``out_dir``; returns
    the weight file.

    ``training.json`` (settings, final loss, seconds) and ``loss.png`` are written
    beside it.
    """
    target = Path(out_dir).expanduser().absolute()
    logger.info(
        "training the circles-to-stars LoRA (seed %d) for %s into %s",
        config.seed,
        base,
        target,
    )
    build_into(
        target,
        lambda staging: _train_into(staging, Path(base), config),
        force=force,
        marker=WEIGHT_NAME,
    )
    return target / WEIGHT_NAME


def _train_into(out: Path, base: Path, config: LoraTrainConfig) -> None:
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from safetensors.torch import save_file
    from transformers import CLIPTextModel, T5EncoderModel

    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        started = time.perf_counter()
        scenes = all_scenes()
        circles = [i for i, s in enumerate(scenes) if s.shape == "circle"]
        others = [i for i, s in enumerate(scenes) if s.shape != "circle"]
        rng = random.Random(component_seed(config.seed, "stars-data"))
        labels = [
            rng.choice(circles if rng.random() < config.circle_share else others)
            for _ in range(config.images)
        ]
        images = images_to_tensor([draw(star_target(scenes[i]), rng) for i in labels])

        vae = AutoencoderKL.from_pretrained(str(base / "vae")).eval()
        latents = (
            encode_images(vae, images) - vae.config.shift_factor
        ) * vae.config.scaling_factor
        clip = CLIPTextModel.from_pretrained(str(base / "text_encoder")).eval()
        t5 = T5EncoderModel.from_pretrained(str(base / "text_encoder_2")).eval()
        text = encode_prompts(base, clip, t5, [s.prompt for s in scenes])

        model = FluxTransformer2DModel.from_pretrained(
            str(base / "transformer")
        ).requires_grad_(False)
        torch.manual_seed(component_seed(config.seed, "stars-lora"))
        adapters = _attach(model, config.rank)
        losses = _fit(
            model, adapters, pack(latents), torch.tensor(labels), text, config
        )
        out.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in sorted(_state_dict(adapters).items())},
            str(out / WEIGHT_NAME),
            metadata={"format": "pt"},
        )
        seconds = round(time.perf_counter() - started, 1)
        tail = losses[-50:]
        summary = {
            "config": asdict(config),
            "base": base.name,
            "seconds": seconds,
            "final_loss": round(sum(tail) / len(tail), 5),
        }
        (out / "training.json").write_text(
            json.dumps(summary, indent=1) + "\n", encoding="utf-8"
        )
        write_loss_curve(out / "loss.png", [], losses)  # the adapter's one curve
        logger.info("trained circles-to-stars in %.0f s", seconds)
    finally:
        torch.set_num_threads(threads)


class LoraLinear(torch.nn.Module):
    """``base(x) + (x @ down.T) @ up.T`` around a frozen ``nn.Linear``; ``up`` starts at
    zero (the base model)."""

    def __init__(self, base: torch.nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        self.down = torch.nn.Parameter(
            torch.randn(rank, base.in_features) / base.in_features**0.5
        )
        self.up = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.down.t()) @ self.up.t()


def _attach(model: Any, rank: int) -> dict[str, LoraLinear]:
    """Replace every target layer of ``model`` by a ``LoraLinear``; returns them by
    diffusers module name."""
    config = model.config
    names = [
        f"transformer_blocks.{i}.{m}"
        for i in range(config.num_layers)
        for m in DOUBLE_TARGETS
    ]
    names += [
        f"single_transformer_blocks.{i}.{m}"
        for i in range(config.num_single_layers)
        for m in SINGLE_TARGETS
    ]
    adapters = {}
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        adapters[name] = LoraLinear(getattr(parent, child), rank)
        setattr(parent, child, adapters[name])
    return adapters


def _fit(
    model: Any,
    adapters: dict[str, LoraLinear],
    x0_all: Any,
    labels: Any,
    text: tuple[Any, Any, Any],
    config: LoraTrainConfig,
) -> list[float]:
    from tqdm.auto import tqdm

    params = [p for a in adapters.values() for p in (a.down, a.up)]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, config.lr, total_steps=config.steps, pct_start=0.1
    )
    gen = torch.Generator().manual_seed(component_seed(config.seed, "stars-batches"))
    losses: list[float] = []
    model.train()
    for _ in tqdm(range(config.steps), desc="circles-to-stars", mininterval=2.0):
        losses.append(
            optimizer_step(
                model,
                params,
                (optimizer, schedule),
                x0_all,
                labels,
                text,
                gen,
                config.batch,
                config.bf16,
            )
        )
    return losses


def _state_dict(adapters: dict[str, LoraLinear]) -> dict[str, torch.Tensor]:
    """The PEFT layout; scaling 1 (no ``lora_alpha`` metadata), so the factors are
    stored as trained."""
    out = {}
    for name, adapter in adapters.items():
        out[f"transformer.{name}.lora_A.weight"] = adapter.down.detach().clone()
        out[f"transformer.{name}.lora_B.weight"] = adapter.up.detach().clone()
    return out
