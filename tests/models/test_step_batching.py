"""Step-level batching in the pipeline: a request joins a running batch at a step
boundary with its own timestep, leaves when its last step is done, and every image is
bit-identical to its request alone, with and without the step cache; requests of other
step counts, cache thresholds and sizes share the batch (each its own schedule, cache
slot and shape group) and stay equal to their requests alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from diffserve.models.base import library_admit
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, StepEvent

# Bit-identity with a request alone rests on the CPU's kernels (an AVX-512 tail once
# broke it on Intel AMX only): make test-kinds runs these under every kind too.
pytestmark = pytest.mark.numerics

STEPS = 6


def _req(**kw: Any) -> GenerationRequest:
    base = dict(
        prompt="a red fox in the snow",
        height=64,
        width=64,
        num_inference_steps=STEPS,
        seed=11,
        max_sequence_length=32,
    )
    return GenerationRequest(**{**base, **kw})


@pytest.fixture(scope="module", params=[None, "fbcache"], ids=["uncached", "fbcache"])
def pipe(request, tiny_flux_dir) -> FluxPipeline:
    cache = {"backend": request.param, "threshold": 0.45} if request.param else {}
    return FluxPipeline.from_pretrained(
        tiny_flux_dir, linear_backend="torch", attention_backend="sdpa", cache=cache
    )


def test_a_request_joins_at_a_step_boundary_and_leaves_when_done(pipe) -> None:
    # Admitted as an engine's requests are (the stage's cache threshold filled in).
    first = library_admit(pipe, _req(seed=1, n=2))
    joiners = [
        library_admit(pipe, _req(prompt="a blue house at night", seed=7)),
        library_admit(pipe, _req(prompt="a green tree", seed=9)),
    ]
    asked = []

    def joins() -> list[GenerationRequest]:
        asked.append(len(asked))
        return (
            [joiners[0]] if len(asked) == 2 else [joiners[1]] if len(asked) == 4 else []
        )

    events = list(pipe.run([first], joins=joins))
    results = [e for e in events if isinstance(e, BatchResult)]
    steps = [e for e in events if isinstance(e, StepEvent)]
    # The first request finishes after its 6 steps; the joiners (after steps 2 and 4) 6
    # steps later each.
    assert [[o.request_id for o in r.outputs] for r in results] == [
        [first.request_id],
        [joiners[0].request_id],
        [joiners[1].request_id],
    ]
    assert len(steps) == 4 + STEPS
    # After the 4th forward: first at 4, joiner 0 at 2.
    progress = dict(steps[3].progress)
    assert progress == {first.request_id: 4, joiners[0].request_id: 2}
    for request, result in zip([first, *joiners], results, strict=True):
        alone = pipe(request)
        output = result.outputs[0]
        assert torch.equal(output.images, alone.images), request.prompt
        assert output.attestation["cache"] == alone.attestation["cache"]
        assert len(output.attestation["cache"]) == request.n


def test_mixed_steps_thresholds_and_sizes_share_one_batch(pipe) -> None:
    first = library_admit(pipe, _req(seed=1))
    # Its own schedule (4 steps), its own cache slot (threshold 0: never skips), its
    # own shape (a group of its own: back to back within each step), and a request of
    # another step count and threshold in the first one's group.
    joiners = [
        library_admit(pipe, _req(seed=2, num_inference_steps=4, cache_threshold=0.0)),
        library_admit(pipe, _req(seed=3, height=32, width=64)),
        library_admit(pipe, _req(seed=4, num_inference_steps=5, cache_threshold=0.9)),
    ]
    calls = iter([[joiners[0], joiners[1]], [], [joiners[2]]])
    events = list(pipe.run([first], joins=lambda: next(calls, [])))
    outputs = {
        o.request_id: o for e in events if isinstance(e, BatchResult) for o in e.outputs
    }
    # The 4-step joiner (joined after step 1) leaves before the first (6 steps).
    order = [
        o.request_id for e in events if isinstance(e, BatchResult) for o in e.outputs
    ]
    assert order.index(joiners[0].request_id) < order.index(first.request_id)
    for request in [first, *joiners]:
        alone = pipe(request)
        output = outputs[request.request_id]
        assert torch.equal(output.images, alone.images), request.seeds
        assert output.attestation["cache"] == alone.attestation["cache"]
    skips = outputs[joiners[2].request_id].attestation["cache"][0]["skipped_steps"]
    # The cached pipe's 0.9 slot really skipped beside rows that never skip.
    assert skips > 0 if pipe.cache.backend == "fbcache" else skips == 0
    assert outputs[joiners[0].request_id].attestation["cache"][0]["skipped_steps"] == 0


def test_a_join_of_another_step_key_is_a_bug(pipe) -> None:
    calls = iter([[library_admit(pipe, _req(guidance_scale=7.0))]])
    with pytest.raises(ValueError, match="another step key"):
        list(pipe.run([library_admit(pipe, _req())], joins=lambda: next(calls, [])))
