"""FLUX.1's flow-matching objective on packed latents, as the toy model and its LoRA are
trained with it: x_t = (1 - s) x0 + s noise, target velocity noise - x0, s drawn from a
logit-normal through the scheduler's resolution-dependent shift (as FluxPipeline samples
at that resolution)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from diffserve.zoo.flux_specs import SCHEDULER_CONFIG


def pack(latents: Any) -> Any:
    """[B, C, H, W] -> [B, H/2 * W/2, C * 4], FluxPipeline's 2x2 packing."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def image_ids(h: int, w: int) -> Any:
    """FLUX's RoPE ids of an (h/2) x (w/2) token grid: (0, row, column)."""
    import torch

    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3)


def shifted_sigmas(u: Any, tokens: int) -> Any:
    """Map ``u`` in (0, 1) through the scheduler's dynamic shift at ``tokens`` image
    tokens (as FluxPipeline)."""
    import math

    cfg = SCHEDULER_CONFIG
    slope = (cfg["max_shift"] - cfg["base_shift"]) / (
        cfg["max_image_seq_len"] - cfg["base_image_seq_len"]
    )
    mu = cfg["base_shift"] + slope * (tokens - cfg["base_image_seq_len"])
    return math.exp(mu) / (math.exp(mu) + (1.0 / u - 1.0))


def optimizer_step(
    model: Any,
    params: list[Any],
    optim: tuple[Any, Any],
    x0_all: Any,
    labels: Any,
    text: tuple[Any, Any, Any],
    gen: Any,
    batch: int,
    bf16: bool,
) -> float:
    """One training step on a random batch of (latents, prompt index) pairs: the
    flow-matching loss, backward, gradient clipping at 1, the optimizer and LR schedule
    steps; returns the loss."""
    import torch

    optimizer, schedule = optim
    prompt_embeds, pooled, text_bias = text
    idx = torch.randint(len(x0_all), (batch,), generator=gen)
    prompt = labels[idx]
    loss = flow_matching_loss(
        model,
        x0_all[idx],
        Conditioning(prompt_embeds[prompt], pooled[prompt], text_bias[prompt]),
        gen,
        bf16=bf16,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    schedule.step()
    return loss.item()


@dataclass(frozen=True)
class Conditioning:
    """A batch's text conditioning as ``encode_prompts`` returns it (one row per
    image)."""

    prompt_embeds: Any  # [B, n + 1, 64]
    pooled: Any  # [B, 32]
    text_bias: Any  # [B, n + 1], additive attention logits of the text tokens


def flow_matching_loss(
    model: Any, x0: Any, text: Conditioning, gen: Any, *, bf16: bool
) -> Any:
    """FLUX.1's flow-matching loss on packed latents ``x0`` [B, tokens, 64] of square
    images: a logit-normal noise level through the scheduler's shift, target velocity
    ``noise - x0``."""
    import torch

    side = 2 * math.isqrt(x0.shape[1])  # latent height = width
    noise = torch.randn(x0.shape, generator=gen)
    sigma = shifted_sigmas(
        torch.sigmoid(torch.randn(len(x0), generator=gen)), x0.shape[1]
    )
    x_t = (1.0 - sigma[:, None, None]) * x0 + sigma[:, None, None] * noise
    mask = torch.cat([text.text_bias, torch.zeros(len(x0), x0.shape[1])], dim=1)[
        :, None, None, :
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        pred = model(
            hidden_states=x_t,
            timestep=sigma,
            pooled_projections=text.pooled,
            encoder_hidden_states=text.prompt_embeds,
            txt_ids=torch.zeros(text.prompt_embeds.shape[1], 3),
            img_ids=image_ids(side, side),
            joint_attention_kwargs={"attention_mask": mask},
            return_dict=False,
        )[0]
    return torch.nn.functional.mse_loss(pred.float(), noise - x0)
