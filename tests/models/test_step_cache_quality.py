"""The step cache's quality gate (issue 14): small-flux, 256x256, 20 steps, float32. Cached images are
compared with the uncached image of the same request (PSNR and SSIM from ``benchmarks/common.py``, the
functions benchmark section h reports with), at each backend's default threshold and at a threshold
that skips most steps on this random-weight model.

Floors are set from measurement on a 2-core AMD EPYC (see docs/cache.md, "Quality gate"), with margin:
the values are deterministic in float32 on one machine and move only in the last digits across CPUs."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.common import psnr, ssim
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.types.request import GenerationRequest

STEPS = 20
# backend -> (default-threshold floors, (skipping threshold, its floors)); floors are (PSNR dB, SSIM).
# Measured (20 steps): fbcache 0.08 skips 0 (identical), 0.65 skips 14 at 53.9 dB / SSIM 0.9999; teacache
# 0.6 (its default) skips 14 at 53.8 dB / 0.9999, 0.8 skips 15 at 52.7 dB / 0.9998. Floors ~5 dB below:
# one decision more or less near a threshold on another CPU moves PSNR by about 2 dB.
GATES = {
    "fbcache": ((60.0, 0.999), (0.65, (48.0, 0.999))),
    "teacache": ((48.0, 0.999), (0.8, (47.0, 0.998))),
}


def _req(**kw) -> GenerationRequest:
    return GenerationRequest(prompt="a red fox in the snow, watercolor", height=256, width=256,
                             num_inference_steps=STEPS, guidance_scale=3.5, seed=42, max_sequence_length=64, **kw)


def _image(pipe: FluxPipeline, **kw) -> tuple[np.ndarray, dict]:
    out = pipe(_req(**kw))
    return out.images[0].numpy(), out.attestation["cache"][0]


@pytest.fixture(scope="module")
def uncached(small_flux_dir) -> np.ndarray:
    return _image(FluxPipeline.from_pretrained(small_flux_dir), cache_threshold=None)[0]


@pytest.mark.parametrize("backend", sorted(GATES))
def test_cached_images_stay_close_to_uncached(small_flux_dir, uncached, backend) -> None:
    pipe = FluxPipeline.from_pretrained(small_flux_dir, cache={"backend": backend})
    (default_psnr, default_ssim), (threshold, (skip_psnr, skip_ssim)) = GATES[backend]
    measured = {}
    for label, kw, floors in (("default", {}, (default_psnr, default_ssim)),
                              (f"threshold {threshold}", {"cache_threshold": threshold}, (skip_psnr, skip_ssim))):
        image, entry = _image(pipe, **kw)
        quality = (psnr(image, uncached), ssim(image, uncached))
        measured[label] = (*quality, f"{entry['skipped_steps']}/{STEPS} skipped")
        assert quality[0] >= floors[0] and quality[1] >= floors[1], (backend, label, measured)
        if kw:
            assert entry["skipped_steps"] >= STEPS // 2, "the gate must cover a threshold that skips most steps"
    print(f"\n[quality gate] {backend}: {measured}")
