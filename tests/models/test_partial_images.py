"""Partial images in the shared native runner: a request's running latents decoded at
evenly spaced steps, the final image the same bit for bit as without them (alone and
beside a request that asks none), the attested kernel counts unchanged, and a model that
cannot preview refuses ``partial_images`` at admission."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from diffserve.errors import RequestError
from diffserve.models.base import library_admit
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.models.runner.previews import preview_steps
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, StepEvent


def _req(**kw: Any) -> GenerationRequest:
    base = dict(
        prompt="a red fox in the snow",
        height=64,
        width=64,
        num_inference_steps=6,
        seed=11,
        max_sequence_length=32,
    )
    return GenerationRequest(**{**base, **kw})


@pytest.fixture(scope="module")
def pipe(tiny_flux_dir) -> FluxPipeline:
    return FluxPipeline.from_pretrained(
        tiny_flux_dir, linear_backend="torch", attention_backend="sdpa"
    )


def _run(pipe: FluxPipeline, requests: list[GenerationRequest]) -> tuple[list, dict]:
    events = list(pipe.run([library_admit(pipe, r) for r in requests]))
    results = {
        o.request_id: o for e in events if isinstance(e, BatchResult) for o in e.outputs
    }
    return [e for e in events if isinstance(e, StepEvent)], results


def test_preview_steps_are_evenly_spaced_and_never_the_last() -> None:
    assert preview_steps(0, 8, 3) == (2, 4, 6)
    assert preview_steps(0, 6, 2) == (2, 4)
    assert preview_steps(0, 4, 3) == (1, 2, 3)
    assert preview_steps(0, 2, 3) == (1,)  # fewer steps than previews asked
    assert preview_steps(0, 1, 3) == ()
    assert preview_steps(3, 9, 2) == (5, 7)  # an edit starts into its schedule
    assert preview_steps(0, 6, 0) == ()


def test_previews_come_at_their_steps_and_leave_the_image_unchanged(pipe) -> None:
    plain = _req(request_id="plain", n=2)
    streamed = _req(request_id="streamed", n=2, partial_images=2)
    pipe.kernel_counters.reset()
    _, alone = _run(pipe, [plain])
    plain_counts = pipe.kernel_counters.snapshot()
    pipe.kernel_counters.reset()
    steps, results = _run(pipe, [streamed])
    streamed_counts = pipe.kernel_counters.snapshot()
    shown = [(e.step, p) for e in steps for p in e.previews]
    assert [(step, p.index) for step, p in shown] == [(2, 0), (4, 1)]
    for _, preview in shown:
        assert preview.request_id == "streamed"
        assert preview.images.dtype == torch.uint8
        assert tuple(preview.images.shape) == (2, 64, 64, 3)
    # Later previews are closer to the image (the noise leaves as the steps go).
    final = results["streamed"].images.numpy().astype(np.float64)
    errors = [np.abs(p.images.numpy() - final).mean() for _, p in shown]
    assert errors[1] < errors[0]
    assert torch.equal(results["streamed"].images, alone["plain"].images)
    # Previews are not the request's work: the attested kernel counts are the same.
    assert streamed_counts == plain_counts and plain_counts


def test_a_batch_mate_without_previews_is_unchanged(pipe) -> None:
    _, alone = _run(pipe, [_req(request_id="a", seed=3)])
    steps, together = _run(
        pipe,
        [_req(request_id="a", seed=3), _req(request_id="b", seed=4, partial_images=3)],
    )
    assert {p.request_id for e in steps for p in e.previews} == {"b"}
    assert [p.index for e in steps for p in e.previews] == [0, 1, 2]
    assert torch.equal(together["a"].images, alone["a"].images)


def test_partial_images_bounds_and_a_model_that_cannot_preview() -> None:
    with pytest.raises(RequestError) as err:
        _req(partial_images=4)
    assert err.value.param == "partial_images"
    with pytest.raises(RequestError):
        _req(partial_images=True)


def test_a_model_that_cannot_preview_refuses_at_admission(pipe) -> None:
    from dataclasses import replace

    assert pipe.capabilities.partial_images  # native FLUX with its VAE here
    generic = replace(pipe.capabilities, implementation="generic", partial_images=False)
    with pytest.raises(RequestError) as err:
        generic.check(_req(partial_images=1))
    assert err.value.param == "partial_images"
    generic.check(_req(partial_images=0))  # none asked: served
