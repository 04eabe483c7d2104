"""Replicas on CUDA devices (``make gpu-check``; skipped without one): each replica's
worker runs on the device ``device_for`` gives it (one per GPU where there are several),
attested per response, images as one replica's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from background import generate_together

from diffserve import Engine, GenerationRequest

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]


def test_two_replicas_on_cuda(tiny_flux_dir: Path) -> None:
    request = dict(
        prompt="a fox",
        height=64,
        width=64,
        num_inference_steps=2,
        max_sequence_length=32,
    )
    stage = dict(env={}, dtype="bfloat16", enforce_eager=True)
    with Engine(str(tiny_flux_dir), **stage) as single:
        reference = {
            seed: np.asarray(
                single.generate(GenerationRequest(seed=seed, **request)).images[0]
            )
            for seed in (1, 2)
        }
    with Engine(
        str(tiny_flux_dir), num_replicas=2, distributed_executor_backend="mp", **stage
    ) as engine:
        outs = generate_together(
            engine, {s: GenerationRequest(seed=s, **request) for s in (1, 2)}
        )
    expected = {f"cuda:{r % torch.cuda.device_count()}" for r in (0, 1)}
    assert {out.attestation["device"] for out in outs.values()} <= expected
    assert {out.attestation["replica"] for out in outs.values()} == {0, 1}
    for seed, out in outs.items():
        assert np.array_equal(np.asarray(out.images[0]), reference[seed])
