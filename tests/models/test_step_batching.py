"""Step-level batching in the pipeline: a request joins a running batch at a step
boundary with its own timestep, leaves when its last step is done, and every image is
bit-identical to its request alone, with and without the step cache."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from diffserve.models.base import library_admit
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, StepEvent

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


def test_a_join_of_another_batch_key_is_a_bug(pipe) -> None:
    calls = iter([[library_admit(pipe, _req(num_inference_steps=STEPS + 1))]])
    with pytest.raises(ValueError, match="another batch key"):
        list(pipe.run([library_admit(pipe, _req())], joins=lambda: next(calls, [])))
