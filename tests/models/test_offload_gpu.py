"""Offload on a CUDA device (``make gpu-check``; skipped without one): the peak device
memory of a request under ``offload: model`` and ``sequential`` is below the run without
offload, and the images are equal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from diffserve.models.base import BuildContext
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.types.request import GenerationRequest

pytestmark = pytest.mark.gpu


def run(model: Path, offload: str) -> tuple[np.ndarray, float, dict[str, str]]:
    from diffserve.config.resolve import resolve

    config = resolve(
        model=model,
        overrides={"dtype": "bfloat16", "enforce_eager": True, "offload": offload},
        platform="cuda",
        env={},
    )
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    pipe = FluxPipeline.from_stage(
        model, config.stages[0], BuildContext(device="cuda:0")
    )
    torch.cuda.reset_peak_memory_stats()
    out = pipe(
        GenerationRequest(
            prompt="a red fox in the snow",
            height=256,
            width=256,
            seed=7,
            num_inference_steps=4,
            max_sequence_length=64,
        )
    )
    peak = torch.cuda.max_memory_allocated() / 2**20
    devices = {name: w.device for name, w in pipe.weights.items()}
    del pipe
    return out.images[0].numpy(), peak, devices


def test_offload_lowers_peak_device_memory_and_keeps_the_image(
    small_flux_dir: Path,
) -> None:
    image, peak, devices = run(small_flux_dir, "none")
    assert set(devices.values()) == {"cuda:0"}
    for mode in ("model", "sequential"):
        offloaded, offload_peak, offload_devices = run(small_flux_dir, mode)
        assert (
            offload_devices["vae"] == "cpu"
            and offload_devices["text_encoder_2"] == "cpu"
        ), mode
        assert offload_peak < peak, (mode, offload_peak, peak)
        assert np.array_equal(offloaded, image), mode


def test_fp8_runs_on_a_capable_gpu_and_is_refused_below_it(
    small_flux_dir: Path,
) -> None:
    from diffserve.config.resolve import resolve
    from diffserve.errors import ConfigError

    if torch.cuda.get_device_capability(0) < (8, 9):
        with pytest.raises(ConfigError, match="compute capability >= 8.9"):
            resolve(
                model=small_flux_dir,
                overrides={"quantization": "fp8"},
                platform="cuda",
                env={},
            )
        return
    config = resolve(
        model=small_flux_dir,
        overrides={"quantization": "fp8", "enforce_eager": True},
        platform="cuda",
        env={},
    )
    pipe = FluxPipeline.from_stage(
        small_flux_dir, config.stages[0], BuildContext(device="cuda:0")
    )
    out = pipe(
        GenerationRequest(
            prompt="a fox", height=256, width=256, seed=1, num_inference_steps=2
        )
    )
    assert out.images[0].float().std() > 0
    assert pipe.kernel_counters.snapshot()["linear"]["fp8_dynamic"] > 0
    assert pipe.weights["transformer"].quantization["backend"] == "fp8_dynamic"
