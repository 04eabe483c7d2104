"""VAE tiling (models/vae_tiling.py, the stage's ``vae`` section): which images are
decoded in tiles, that the attestation says so on both paths, and that a 1024x1024
decode in tiles peaks lower than the whole-image decode while its seam-blended image
stays close to it (figures in docs/models.md, "VAE tiling")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.common import psnr
from diffserve.config.resolve import resolve
from diffserve.config.stage_sections import VaeConfig
from diffserve.errors import ConfigError
from diffserve.models.vae_tiling import wants_tiling


def test_which_sizes_are_tiled() -> None:
    auto = VaeConfig()
    assert not wants_tiling(auto, 1024, 1000)  # below a megapixel
    assert wants_tiling(auto, 1024, 1024) and wants_tiling(auto, 768, 1536)
    # One tile: nothing to tile.
    assert not wants_tiling(VaeConfig(tiling="on"), 512, 512)
    assert wants_tiling(VaeConfig(tiling="on"), 512, 576)
    assert not wants_tiling(VaeConfig(tiling="off"), 4096, 4096)
    assert wants_tiling(VaeConfig(tiling_min_pixels=600 * 600), 640, 640)


def test_config_keys_flags_and_errors(tiny_flux_dir: Path) -> None:
    config = resolve(
        model=str(tiny_flux_dir),
        env={"DIFFSERVE_VAE_TILING": "never"},
        overrides={"vae_tile_size": 256},
    )
    vae = config.stages[0].vae
    assert (vae.tiling, vae.tile_size, vae.tiling_min_pixels) == (
        "off",
        256,
        1024 * 1024,
    )
    assert config.source_of("stages.0.vae.tiling").layer == "env"
    assert config.source_of("stages.0.vae.tiling_min_pixels").layer == "default"
    with pytest.raises(ConfigError, match="vae.tile_size") as info:
        resolve(model=str(tiny_flux_dir), env={}, overrides={"vae_tile_size": 100})
    assert "multiple of 64" in str(info.value)
    with pytest.raises(ConfigError, match="VAE tiling mode"):
        resolve(model=str(tiny_flux_dir), env={}, overrides={"vae_tiling": "sometimes"})


def _image(model: Path, steps: int = 1, **overrides) -> tuple[np.ndarray, dict]:
    from diffserve import Engine, GenerationRequest

    request = GenerationRequest(
        prompt="a fox",
        height=128,
        width=192,
        num_inference_steps=steps,
        seed=5,
        max_sequence_length=16,
        output_type="pt",
    )
    with Engine(str(model), dtype="float32", env={}, **overrides) as engine:
        out = engine.generate(request)
    return out.images[0].numpy(), out.attestation


@pytest.mark.parametrize(
    "fixture",
    ["tiny_flux_dir", "tiny_sd3_dir", "tiny_qwen_image_dir"],
    ids=["native-flux", "generic-sd3", "generic-qwen-image"],
)  # Qwen-Image: a Wan-layout VAE
def test_tiles_are_attested_and_blend_close_to_the_whole_image(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    model = request.getfixturevalue(fixture)
    # Its scheduler's terminal shift needs two.
    steps = 2 if fixture == "tiny_qwen_image_dir" else 1
    whole, plain = _image(model, steps, vae_tiling="off")
    tiled, attested = _image(model, steps, vae_tiling="on", vae_tile_size=64)
    assert plain["vae_tiled"] is False and attested["vae_tiled"] is True
    assert tiled.shape == whole.shape
    # Random-weight VAEs: what matters is that tiles are blended into one image of the
    # right content, not a quality figure (the trained figures are in the memory test
    # below and docs/models.md).
    assert 20.0 <= psnr(tiled, whole) < 200.0


SCRIPT = r"""
import json, math, sys, torch
from diffserve.config.schema import VaeConfig
from diffserve.models.vae_file import load_vae
from diffserve.models.vae_tiling import configure_tiling, tiling

# Peak RSS of this process since the last reset (VmHWM: per address space, not
# inherited).
def peak_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024

def reset_peak():  # Linux: "5" resets VmHWM to the current RSS
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

vae = load_vae(sys.argv[1], dtype=torch.float32, device="cpu")
# 768x768 in 256-pixel tiles: the peaks differ as they do at 1024 in the default 512
# tiles (~310 vs ~480 MiB apart), at ~60% of the decode work (the auto threshold itself:
# test_which_sizes_are_tiled).
config = VaeConfig(tiling="on", tile_size=256)
configure_tiling(vae, config)
seeded = torch.Generator().manual_seed(0)
latents = torch.randn(1, vae.config.latent_channels, 96, 96, generator=seeded)
peaks, images = {}, {}
with torch.inference_mode():
    for label in ("tiled", "whole"):
        reset_peak()
        chosen = config if label == "tiled" else VaeConfig(tiling="off")
        with tiling(vae, chosen, 768, 768) as tiled:
            assert tiled == (label == "tiled")
            images[label] = vae.decode(latents, return_dict=False)[0].clamp(-1, 1)
        peaks[label] = peak_mib()
mse = torch.mean((images["tiled"] - images["whole"]) ** 2 / 4).item()
print(json.dumps({"peak_mib": peaks, "psnr": 10 * math.log10(1 / max(mse, 1e-20))}))
"""


def test_a_large_image_decodes_in_tiles_with_a_lower_peak(tiny_flux_dir: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_flux_dir / "vae")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    peaks = result["peak_mib"]
    # Each decode's own peak (the process's baseline included): the whole image needs
    # far more.
    assert peaks["whole"] - peaks["tiled"] >= 200, result
    assert result["psnr"] >= 20.0, result
