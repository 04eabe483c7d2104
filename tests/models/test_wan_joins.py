"""Wan in step-level batches: a request joins a running batch at a step boundary with
its own schedule (steps, UniPC history, experts) and its own cache slot, and every video
is bit-identical to its request alone (``batch_invariant``), with its own experts and
cache decisions attested. On the tiny Wan2.2 (boundary 875 of 1000) A's 5 steps are
999 923 | 818 667 429 and B's 6 are 999 937 | 857 750 600 376: B joins at A's step 2,
so two steps run the low-noise expert on A's rows and the high-noise one on B's in the
same step, and B crosses the boundary beside A."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from diffserve.config.resolve import resolve
from diffserve.models.base import BuildContext, library_admit
from diffserve.models.wan.pipeline import WanVideoPipeline
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, RequestResult

# Bit-identity with a request alone rests on the CPU's kernels (an AVX-512 tail once
# broke it on Intel AMX only): make test-kinds runs these under every kind too.
pytestmark = pytest.mark.numerics

BASE = dict(
    prompt="a red ball rolling to the left",
    negative_prompt="blurry",
    height=32,
    width=32,
    num_frames=5,
    guidance_scale=5.0,
    # The denoised latents: what the runner batches (the VAE decodes each video alone).
    output_type="latent",
)


@pytest.fixture(scope="module")
def pipeline(tiny_wan22_dir: Path) -> WanVideoPipeline:
    config = resolve(
        model=tiny_wan22_dir,
        overrides={
            "dtype": "float32",
            "enforce_eager": True,
            "batch_invariant": True,
            "cache": {"backend": "fbcache"},
        },
        env={},
    )
    return WanVideoPipeline.from_stage(
        tiny_wan22_dir, config.stage_for_role("diffusion"), BuildContext()
    )


def _request(pipe: WanVideoPipeline, **fields: Any) -> GenerationRequest:
    return library_admit(pipe, GenerationRequest(**{**BASE, **fields}))


def _run(
    pipe: WanVideoPipeline,
    first: GenerationRequest,
    joiner: GenerationRequest | None = None,
    at: int = 2,
) -> dict[str, RequestResult]:
    """``first`` from step 0 and ``joiner`` joining after ``at`` steps; results by
    request id."""
    asked: list[int] = []

    def joins() -> list[GenerationRequest]:
        asked.append(len(asked))
        return [joiner] if joiner is not None and len(asked) == at else []

    return {
        output.request_id: output
        for event in pipe.run([first], joins=joins)
        if isinstance(event, BatchResult)
        for output in event.outputs
    }


@pytest.mark.parametrize(
    "thresholds", [(0.0, 0.0), (50.0, 0.0), (0.0, 50.0)], ids=["off", "a", "b"]
)
def test_a_joiner_of_other_steps_and_experts_runs_as_alone(
    pipeline: WanVideoPipeline, thresholds: tuple[float, float]
) -> None:
    a = _request(pipeline, seed=1, num_inference_steps=5, cache_threshold=thresholds[0])
    b = _request(
        pipeline, seed=2, num_inference_steps=6, n=2, cache_threshold=thresholds[1]
    )
    together = _run(pipeline, a, b)
    for request in (a, b):
        alone = _run(pipeline, request)[request.request_id]
        joined = together[request.request_id]
        assert torch.equal(joined.images, alone.images), request.request_id
        assert joined.attestation["experts"] == alone.attestation["experts"]
        assert joined.attestation["cache"] == alone.attestation["cache"]
    experts = together[b.request_id].attestation["experts"]
    assert experts["steps"] == ["transformer"] * 2 + ["transformer_2"] * 4
    assert experts["forwards"] == {"transformer": 4, "transformer_2": 8}  # CFG: 2/step
    assert together[a.request_id].attestation["experts"]["steps"] == (
        ["transformer"] * 2 + ["transformer_2"] * 3
    )
    for request, threshold in zip((a, b), thresholds, strict=True):
        entries = together[request.request_id].attestation["cache"]
        assert len(entries) == request.n
        skipped = [e["skipped_steps"] + e["negative"]["skipped_steps"] for e in entries]
        # The request with a threshold skips; the other computes every step.
        assert all(s > 0 for s in skipped) if threshold else skipped == [0] * request.n
