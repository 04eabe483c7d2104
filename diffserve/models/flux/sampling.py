"""FLUX sampling as pure functions: noise, 2x2 packing, position ids, the flow-match
Euler schedule.

The schedule reproduces diffusers' ``FlowMatchEulerDiscreteScheduler`` (float32 sigmas,
exponential time shift with ``mu`` from the image sequence length when
``use_dynamic_shifting``), so images match.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from diffserve.errors import ModelLoadError

# Scheduler options FLUX never uses; a config that turns one on would silently change
# the images.
_UNSUPPORTED = (
    "shift_terminal",
    "use_karras_sigmas",
    "use_exponential_sigmas",
    "use_beta_sigmas",
    "invert_sigmas",
    "stochastic_sampling",
    "use_flow_sigmas",
)


def check_scheduler_config(config: Mapping[str, Any]) -> None:
    enabled = [key for key in _UNSUPPORTED if config.get(key)]
    if enabled:
        raise ModelLoadError(
            f"scheduler options {enabled} are not supported by the "
            "FLUX flow-match Euler sampler"
        )
    if config.get("time_shift_type", "exponential") != "exponential":
        raise ModelLoadError(
            f"time_shift_type={config['time_shift_type']!r} is not "
            "supported (exponential only)"
        )


def get_noise(
    seeds: Sequence[int],
    channels: int,
    height: int,
    width: int,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
) -> Tensor:
    """Latent noise ``[n, channels, height // 8, width // 8]``; image i is drawn from
    its own CPU generator seeded with ``seeds[i]``, so it does not depend on the batch
    it runs in (or on the device)."""
    shape = (1, channels, 2 * (height // 16), 2 * (width // 16))
    noise = [
        torch.randn(shape, generator=torch.Generator("cpu").manual_seed(s), dtype=dtype)
        for s in seeds
    ]
    return torch.cat(noise).to(device)


def pack(latents: Tensor) -> Tensor:
    """``[B, C, H, W]`` -> ``[B, (H/2)(W/2), C*4]``: each 2x2 patch becomes one
    token."""
    b, c, h, w = latents.shape
    return (
        latents.view(b, c, h // 2, 2, w // 2, 2)
        .permute(0, 2, 4, 1, 3, 5)
        .reshape(b, (h // 2) * (w // 2), c * 4)
    )


def unpack(tokens: Tensor, height: int, width: int) -> Tensor:
    """Inverse of ``pack`` for an image of ``height`` x ``width`` pixels."""
    b, _, d = tokens.shape
    h, w = height // 16, width // 16
    return (
        tokens.view(b, h, w, d // 4, 2, 2)
        .permute(0, 3, 1, 4, 2, 5)
        .reshape(b, d // 4, h * 2, w * 2)
    )


def image_ids(
    height: int, width: int, *, device: torch.device | str, dtype: torch.dtype
) -> Tensor:
    """Position ids ``[(H/16)(W/16), 3]`` = (0, row, col) of each packed token."""
    h, w = height // 16, width // 16
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, 3).to(device=device, dtype=dtype)


def text_ids(length: int, *, device: torch.device | str, dtype: torch.dtype) -> Tensor:
    return torch.zeros(length, 3, device=device, dtype=dtype)


def calculate_shift(
    image_seq_len: int,
    base_seq_len: int = 256,
    max_seq_len: int = 4096,
    base_shift: float = 0.5,
    max_shift: float = 1.15,
) -> float:
    """``mu`` interpolated linearly in the image token count (more tokens: more time at
    high noise)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + (base_shift - m * base_seq_len)


def get_schedule(
    num_steps: int, image_seq_len: int, config: Mapping[str, Any]
) -> tuple[Tensor, Tensor]:
    """Return ``(sigmas [num_steps + 1], timesteps [num_steps])`` in float32, ending at
    sigma 0.

    Sigmas start as ``linspace(1, 1/num_steps, num_steps)`` and are time-shifted, either
    with ``mu`` from the image sequence length (``use_dynamic_shifting``, FLUX.1-dev) or
    with the fixed ``shift``.
    """
    sigmas: np.ndarray = np.linspace(1.0, 1 / num_steps, num_steps).astype(np.float32)
    if config.get("use_dynamic_shifting", False):
        mu = calculate_shift(
            image_seq_len,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        sigmas = math.exp(mu) / (math.exp(mu) + (1 / sigmas - 1) ** 1.0)
    else:
        shift = config.get("shift", 1.0)
        sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    sigma_t = torch.from_numpy(np.asarray(sigmas, dtype=np.float32))
    timesteps = sigma_t * config.get("num_train_timesteps", 1000)
    return torch.cat([sigma_t, torch.zeros(1)]), timesteps


def euler_step(
    latents: Tensor, velocity: Tensor, sigma: Tensor, sigma_next: Tensor
) -> Tensor:
    """One flow-match Euler step, accumulated in float32 and returned in the velocity's
    dtype."""
    return (latents.to(torch.float32) + (sigma_next - sigma) * velocity).to(
        velocity.dtype
    )


class EulerSchedule:
    """One request's flow-match Euler schedule (``models/runner``'s ``Schedule``):
    stateless per step, so its rows step at their own index of its own sigmas, whatever
    the other rows of the batch do."""

    def __init__(
        self,
        steps: int,
        image_tokens: int,
        config: Mapping[str, Any],
        device: torch.device,
    ) -> None:
        sigmas, timesteps = get_schedule(steps, image_tokens, config)
        self.steps = steps
        self.sigmas, self.timesteps = sigmas.to(device), timesteps.to(device)

    def begin(self, step: int) -> bool:
        return False  # one transformer for every step

    def model_timestep(self, step: int, dtype: torch.dtype) -> Tensor:
        """The timestep as the transformer takes it: as diffusers, sigma * 1000 in the
        model dtype, then back to [0, 1]."""
        return self.timesteps[step].to(dtype) / 1000

    def step(self, latents: Tensor, velocity: Tensor, step: int) -> Tensor:
        return euler_step(latents, velocity, self.sigmas[step], self.sigmas[step + 1])
