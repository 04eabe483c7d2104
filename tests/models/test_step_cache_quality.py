"""The step cache's quality gates. Cached images are compared with the uncached image of
the same request (PSNR and SSIM from ``benchmarks/common.py``, the functions benchmark
sections h and l report with), at each backend's default threshold and at a threshold
that skips most steps.

- small-flux (issue 14), 128x128 (256x256 measured alike, at 4x the suite's time), 20
  steps, float32: a
  random-weight model, where block 0's residual changes by ~0.5 per step, so the
  published fbcache default skips nothing and the gate sweeps higher.
- toy-shapes (issue 20), the shipped trained model, 64x64, 28 steps, float32, held-out
  prompt/seed pairs:
  its per-step signals are like trained FLUX.1-dev's, so the published defaults skip
  there as published; the grammar's checker must read the cached images as well as the
  uncached ones.

Floors are set from measurement on a 2-core AMD EPYC (see docs/cache.md, "Quality
gate"), with margin: the values are deterministic in float32 on one machine and move
only in the last digits across CPUs."""

from __future__ import annotations

import random

import numpy as np
import pytest

from benchmarks.common import psnr, ssim
from diffserve.models.base import library_admit
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult
from diffserve.zoo.toy_shapes.train import TEXT_LENGTH

STEPS = 20
# backend -> (default-threshold floors, (skipping threshold, its floors)); floors are
# (PSNR dB, SSIM). Measured (20 steps, 128x128, Intel AMX): fbcache 0.08 skips 0
# (identical), 0.65 skips 15 at 52.1 dB / SSIM 0.9998; teacache 0.6 (its default) skips
# 14 at 53.6 dB / 0.9999, 0.8 skips 15 at 52.4 dB / 0.9998 (at 256x256, AMD: 53.9, 53.8,
# 52.7 dB). Floors ~5 dB below: one decision more or less near a threshold on another
# CPU moves PSNR by about 2 dB.
GATES = {
    "fbcache": ((60.0, 0.999), (0.65, (48.0, 0.999))),
    "teacache": ((48.0, 0.999), (0.8, (47.0, 0.998))),
}


def _req(**kw) -> GenerationRequest:
    return GenerationRequest(
        prompt="a red fox in the snow, watercolor",
        height=128,
        width=128,
        num_inference_steps=STEPS,
        guidance_scale=3.5,
        seed=42,
        max_sequence_length=64,
        **kw,
    )


def _image(pipe: FluxPipeline, **kw) -> tuple[np.ndarray, dict]:
    out = pipe(_req(**kw))
    return out.images[0].numpy(), out.attestation["cache"][0]


@pytest.fixture(scope="module")
def uncached(small_flux_dir) -> np.ndarray:
    return _image(FluxPipeline.from_pretrained(small_flux_dir), cache_threshold=None)[0]


@pytest.mark.parametrize("backend", sorted(GATES))
def test_cached_images_stay_close_to_uncached(
    small_flux_dir, uncached, backend
) -> None:
    pipe = FluxPipeline.from_pretrained(small_flux_dir, cache={"backend": backend})
    (default_psnr, default_ssim), (threshold, (skip_psnr, skip_ssim)) = GATES[backend]
    measured = {}
    for label, kw, floors in (
        ("default", {}, (default_psnr, default_ssim)),
        (
            f"threshold {threshold}",
            {"cache_threshold": threshold},
            (skip_psnr, skip_ssim),
        ),
    ):
        image, entry = _image(pipe, **kw)
        quality = (psnr(image, uncached), ssim(image, uncached))
        measured[label] = (*quality, f"{entry['skipped_steps']}/{STEPS} skipped")
        assert quality[0] >= floors[0] and quality[1] >= floors[1], (
            backend,
            label,
            measured,
        )
        if kw:
            assert entry["skipped_steps"] >= STEPS // 2, (
                "the gate must cover a threshold that skips most steps"
            )
    print(f"\n[quality gate] {backend}: {measured}")


# -- toy-shapes: the trained model
# --------------------------------------------------------------------

TOY_STEPS = 28
TOY_PAIRS = 12
# backend -> ((threshold or None for the stage default, least skipped steps per image,
# PSNR floor, SSIM floor), ...). PSNR: over all pairs' pixels together (one pooled MSE);
# SSIM: mean over the pairs. Measured (28 steps, 12 pairs; the checker reads 8/12
# uncached images as their prompt, 9/12 at every point below): fbcache  0.08 (default)
# skips 10-14 per image, 41.0 dB, SSIM 0.9971; 0.3 skips 22-23, 29.2 dB, 0.9677 teacache
# 0.6 (default)  skips 20,              35.2 dB, SSIM 0.9898; 0.8 skips 21,    33.5 dB,
# 0.9852 Floors ~4-5 dB (SSIM ~0.01-0.02) below. On the random small-flux above,
# fbcache's default skips nothing.
TOY_GATES = {
    "fbcache": ((None, 5, 36.0, 0.99), (0.3, TOY_STEPS // 2, 25.0, 0.95)),
    "teacache": (
        (None, TOY_STEPS // 2, 31.0, 0.98),
        (0.8, TOY_STEPS // 2, 29.0, 0.975),
    ),
}
# Cached images may read as their prompt for one pair fewer than uncached ones.
TOY_AGREEMENT_ALLOWANCE = 1


def toy_pairs() -> list[tuple[str, int]]:
    """Held-out pairs: generation seeds far from training's and from
    tests/zoo/test_toy_shapes.py's."""
    from diffserve.zoo.toy_shapes.grammar import all_scenes

    rng = random.Random(28)
    scenes = all_scenes()
    return [(rng.choice(scenes).prompt, 2_000_000 + i) for i in range(TOY_PAIRS)]


def _toy_batch(pipe: FluxPipeline, **kw) -> tuple[list[np.ndarray], list[dict]]:
    """Every pair in one batch: each image row decides alone. A quality gate, not an
    invariance one: whole-batch kernels (``batch_invariant=False``; per-sample calls
    cost ~40% more at 64x64), the same 12 rows both ways."""
    requests = [
        library_admit(
            pipe,
            GenerationRequest(
                prompt=prompt,
                height=64,
                width=64,
                num_inference_steps=TOY_STEPS,
                guidance_scale=0.0,
                max_sequence_length=TEXT_LENGTH,
                seed=seed,
                **kw,
            ),
        )
        for prompt, seed in toy_pairs()
    ]
    outputs = [
        out
        for event in pipe.run(requests)
        if isinstance(event, BatchResult)
        for out in event.outputs
    ]
    return [out.images[0].numpy() for out in outputs], [
        out.attestation["cache"][0] for out in outputs
    ]


def _agreement(images: list[np.ndarray]) -> int:
    from PIL import Image

    from diffserve.zoo.toy_shapes.grammar import classify, parse_prompt

    return sum(
        classify(Image.fromarray(image)) == parse_prompt(prompt)
        for (prompt, _), image in zip(toy_pairs(), images, strict=True)
    )


@pytest.fixture(scope="module")
def toy_uncached() -> list[np.ndarray]:
    from diffserve.zoo.demo import toy_model_dir

    return _toy_batch(
        FluxPipeline.from_pretrained(toy_model_dir(), batch_invariant=False)
    )[0]


@pytest.mark.parametrize("backend", sorted(TOY_GATES))
def test_cached_images_of_the_trained_model_stay_close_and_still_draw_the_prompt(
    toy_uncached, backend
) -> None:
    from diffserve.zoo.demo import toy_model_dir

    pipe = FluxPipeline.from_pretrained(
        toy_model_dir(), cache={"backend": backend}, batch_invariant=False
    )
    uncached_agreement = _agreement(toy_uncached)
    measured = {"uncached agreement": uncached_agreement}
    for threshold, least_skipped, psnr_floor, ssim_floor in TOY_GATES[backend]:
        images, entries = _toy_batch(
            pipe, **({} if threshold is None else {"cache_threshold": threshold})
        )
        skipped = [entry["skipped_steps"] for entry in entries]
        quality = (
            psnr(np.concatenate(images), np.concatenate(toy_uncached)),
            float(
                np.mean([ssim(a, b) for a, b in zip(images, toy_uncached, strict=True)])
            ),
        )
        agreement = _agreement(images)
        label = (
            f"threshold {threshold}"
            if threshold is not None
            else f"default {entries[0]['threshold']}"
        )
        measured[label] = (
            round(quality[0], 2),
            round(quality[1], 5),
            f"skipped {min(skipped)}-{max(skipped)}/{TOY_STEPS}",
            f"agreement {agreement}/{TOY_PAIRS}",
        )
        # The point of the gate: the published defaults skip steps on a trained model
        # (not on a random one).
        assert min(skipped) >= least_skipped, (backend, label, measured)
        assert quality[0] >= psnr_floor and quality[1] >= ssim_floor, (
            backend,
            label,
            measured,
        )
        assert agreement >= uncached_agreement - TOY_AGREEMENT_ALLOWANCE, (
            backend,
            label,
            measured,
        )
    print(f"\n[quality gate, toy-shapes] {backend}: {measured}")
