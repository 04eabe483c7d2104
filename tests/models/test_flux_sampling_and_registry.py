"""The flow-match Euler schedule and packing vs diffusers; the model registry."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffserve.errors import ModelLoadError
from diffserve.models.flux.sampling import (
    calculate_shift,
    check_scheduler_config,
    euler_step,
    get_noise,
    get_schedule,
    image_ids,
    pack,
    unpack,
)
from diffserve.registry.models import MODEL_FAMILIES

DEV = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}
SCHNELL = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False}


@pytest.mark.parametrize(
    "config",
    [DEV, SCHNELL, {**SCHNELL, "shift": 3.0}],
    ids=["dynamic", "shift1", "shift3"],
)
@pytest.mark.parametrize("steps, seq_len", [(1, 16), (4, 60), (28, 4096)])
def test_schedule_matches_diffusers(config: dict, steps: int, seq_len: int) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import (
        calculate_shift as diffusers_shift,
    )

    ref = FlowMatchEulerDiscreteScheduler(**config)
    mu = diffusers_shift(seq_len, 256, 4096, 0.5, 1.15)
    ref.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    sigmas, timesteps = get_schedule(steps, seq_len, config)
    assert calculate_shift(seq_len) == mu
    # Exact although diffusers' is another implementation: the same elementwise numpy
    # ops in the same order (each correctly rounded; exp from the same libm), no
    # reduction or GEMM whose order a CPU kind could change.
    torch.testing.assert_close(sigmas, ref.sigmas, rtol=0, atol=0)
    torch.testing.assert_close(timesteps, ref.timesteps, rtol=0, atol=0)
    assert (
        sigmas[0] <= 1.0 and sigmas[-1] == 0 and bool((sigmas[1:] < sigmas[:-1]).all())
    )


def test_euler_step_matches_diffusers() -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler

    ref = FlowMatchEulerDiscreteScheduler(**DEV)
    ref.set_timesteps(sigmas=np.linspace(1.0, 0.5, 2), mu=0.7)
    x, v = torch.randn(2, 6, 64), torch.randn(2, 6, 64)
    expected = ref.step(v, ref.timesteps[0], x, return_dict=False)[0]
    # Exact: diffusers' step is the same float32 multiply then add, elementwise
    # (correctly rounded on any CPU).
    torch.testing.assert_close(
        euler_step(x, v, ref.sigmas[0], ref.sigmas[1]), expected, rtol=0, atol=0
    )


def test_pack_unpack_roundtrip_and_ids_non_square() -> None:
    latents = torch.randn(2, 16, 12, 20)  # 96 x 160 pixels
    tokens = pack(latents)
    assert tokens.shape == (2, 6 * 10, 64)
    torch.testing.assert_close(unpack(tokens, 96, 160), latents, rtol=0, atol=0)
    ids = image_ids(96, 160, device="cpu", dtype=torch.float32)
    assert (
        ids.shape == (60, 3)
        and ids[11].tolist() == [0.0, 1.0, 1.0]
        and ids[:, 2].max() == 9
    )


def test_noise_is_per_image_seed() -> None:
    both = get_noise([3, 4], 16, 64, 32, dtype=torch.float32, device="cpu")
    assert both.shape == (2, 16, 8, 4)
    torch.testing.assert_close(
        both[1:], get_noise([4], 16, 64, 32, dtype=torch.float32, device="cpu")
    )
    assert not torch.equal(both[0], both[1])


def test_unsupported_scheduler_options_are_refused() -> None:
    with pytest.raises(ModelLoadError, match="use_karras_sigmas"):
        check_scheduler_config({**DEV, "use_karras_sigmas": True})


def test_registry_is_the_one_list(tmp_path) -> None:
    from diffserve.config.resolve import resolve
    from diffserve.errors import ConfigError
    from diffserve.models.flux.pipeline import FluxPipeline

    family = MODEL_FAMILIES["FluxPipeline"]
    assert family.load_pipeline_class() is FluxPipeline
    (tmp_path / "model_index.json").write_text(
        json.dumps({"_class_name": "StableDiffusionPipeline"})
    )
    # The resolver refuses what the registry does not list, naming what it does.
    with pytest.raises(ConfigError, match="StableDiffusionPipeline") as info:
        resolve(model=str(tmp_path), env={})
    assert "FluxPipeline" in str(info.value)
