"""FluxPipeline end to end on the hermetic tiny-flux models: parity with diffusers,
seeds, events, checks."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch

from diffserve.config.resolve import resolve
from diffserve.errors import BackendUnavailableError, RequestError
from diffserve.layers.attention.module import Attention
from diffserve.layers.linear.module import Linear
from diffserve.models.base import BuildContext, Pipeline, library_admit
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.types.request import GenerationRequest
from diffserve.types.results import BatchResult, StepEvent, to_pil


@pytest.fixture(scope="module")
def pipe(tiny_flux_dir) -> FluxPipeline:
    return FluxPipeline.from_pretrained(
        tiny_flux_dir, linear_backend="torch", attention_backend="sdpa"
    )


@pytest.fixture(scope="module")
def dev_pipe(tiny_flux_dev_dir) -> FluxPipeline:
    return FluxPipeline.from_pretrained(
        tiny_flux_dev_dir, linear_backend="torch", attention_backend="sdpa"
    )


def _req(**kw) -> GenerationRequest:
    # A short T5 window keeps the joint sequence (and the tests) small; 512 is exercised
    # by parity.
    base = dict(
        prompt="a red fox in the snow",
        height=64,
        width=64,
        num_inference_steps=2,
        seed=11,
        max_sequence_length=64,
    )
    return GenerationRequest(**{**base, **kw})


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


_REFERENCES: dict[str, object] = {}


def _diffusers_images(model_dir, request: GenerationRequest) -> np.ndarray:
    from diffusers import FluxPipeline as DiffusersFluxPipeline

    if str(model_dir) not in _REFERENCES:
        _REFERENCES[str(model_dir)] = DiffusersFluxPipeline.from_pretrained(
            str(model_dir), torch_dtype=torch.float32
        )
        _REFERENCES[str(model_dir)].set_progress_bar_config(disable=True)
    images = _REFERENCES[str(model_dir)](
        max_sequence_length=request.max_sequence_length,
        prompt=request.prompt,
        negative_prompt=request.negative_prompt,
        height=request.height,
        width=request.width,
        num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale,
        true_cfg_scale=request.true_cfg_scale,
        generator=torch.Generator().manual_seed(request.seed),
        output_type="np",
    ).images
    return (images * 255).round().astype(np.uint8)


@pytest.mark.parametrize(
    "kind, request_kw",
    [
        ("schnell", dict(guidance_scale=0.0)),
        (
            "dev",
            dict(
                height=96,
                width=160,
                num_inference_steps=3,
                guidance_scale=3.5,
                max_sequence_length=512,
            ),
        ),
        ("schnell", dict(negative_prompt="blurry", true_cfg_scale=2.5, width=96)),
    ],
    ids=["schnell-64", "dev-96x160", "schnell-true-cfg"],
)
@pytest.mark.numerics
def test_images_match_diffusers(request, kind: str, request_kw: dict) -> None:
    pipeline = request.getfixturevalue("pipe" if kind == "schnell" else "dev_pipe")
    model_dir = request.getfixturevalue(
        "tiny_flux_dir" if kind == "schnell" else "tiny_flux_dev_dir"
    )
    req = _req(**request_kw)
    ours = pipeline(req).images.numpy()
    theirs = _diffusers_images(model_dir, req)
    assert ours.shape == theirs.shape == (1, req.height, req.width, 3)
    assert _psnr(ours, theirs) >= 40.0


def test_events_then_result_and_counters(pipe: FluxPipeline) -> None:
    transformer = pipe.transformer
    n_linear = sum(isinstance(m, Linear) for m in transformer.modules())
    attentions = [m for m in transformer.modules() if isinstance(m, Attention)]
    assert {m.backend_name for m in transformer.modules() if isinstance(m, Linear)} == {
        "torch"
    }
    assert {m.backend_name for m in attentions} == {"sdpa"}
    transformer.counters.reset()
    events = list(pipe.run([library_admit(pipe, _req(num_inference_steps=2))]))
    assert [(e.step, e.total_steps) for e in events[:2]] == [(1, 2), (2, 2)]
    assert all(isinstance(e, StepEvent) for e in events[:2])
    assert isinstance(events[2], BatchResult) and len(events) == 3
    assert transformer.counters.snapshot() == {
        "linear": {"torch": 2 * n_linear},
        "attention": {"sdpa": 2 * len(attentions)},
        "transformer_forwards": 2,
    }
    result = events[2].outputs[0]
    assert set(result.timings_ms) == {"encode", "denoise", "decode"}
    assert result.images.dtype == torch.uint8 and result.images.device.type == "cpu"


def test_closing_the_generator_cancels(pipe: FluxPipeline) -> None:
    pipe.transformer.counters.reset()
    run = pipe.run([library_admit(pipe, _req(num_inference_steps=4))])
    first = next(run)
    assert (first.step, first.total_steps) == (1, 4)
    run.close()
    assert pipe.transformer.counters.snapshot()["transformer_forwards"] == 1


def _png(images: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    to_pil(images)[0].save(buffer, format="PNG")
    return buffer.getvalue()


def test_seeds_reproduce_and_differ(pipe: FluxPipeline) -> None:
    a, b, c = pipe(_req(seed=5)), pipe(_req(seed=5)), pipe(_req(seed=6))
    assert _png(a.images) == _png(b.images)
    assert _png(a.images) != _png(c.images)


@pytest.mark.numerics
def test_n_images_reproduce_single_requests(pipe: FluxPipeline) -> None:
    both = pipe(_req(seed=40, n=2))
    assert both.seeds == [40, 41] and both.images.shape[0] == 2
    for i, seed in enumerate(both.seeds):
        assert torch.equal(both.images[i], pipe(_req(seed=seed)).images[0])


def test_a_library_call_gets_the_family_defaults_once(
    pipe: FluxPipeline, dev_pipe: FluxPipeline
) -> None:
    # run_one is a library call's admission: the registry's FLUX defaults (28 steps,
    # guidance 3.5, T5 512); run() itself fills nothing (an engine's admission did).
    for pipeline in (pipe, dev_pipe):
        pipeline.kernel_counters.reset()
        pipeline(GenerationRequest(prompt="a fox", height=32, width=32, seed=1))
        assert pipeline.kernel_counters.snapshot()["transformer_forwards"] == 28
    with pytest.raises(RequestError, match="above this model's 512 tokens"):
        pipe(_req(max_sequence_length=513))


def test_seeds_are_assigned_at_admission_not_here(pipe: FluxPipeline) -> None:
    # The engine seeds every request once (engine/admission.py); the pipeline never
    # invents one.
    with pytest.raises(RequestError, match="no seed"):
        pipe(_req(seed=None))


@pytest.mark.numerics
@pytest.mark.parametrize("cfg", [{}, dict(negative_prompt="dark", true_cfg_scale=3.0)])
def test_batch_equals_requests_alone(pipe: FluxPipeline, cfg: dict) -> None:
    # One batch key (as the scheduler forms them), different prompts, seeds and image
    # counts.
    batch = [_req(seed=1, **cfg), _req(prompt="a blue house", seed=2, n=2, **cfg)]
    events = list(pipe.run([library_admit(pipe, r) for r in batch]))
    outputs = events[-1].outputs
    assert [o.request_id for o in outputs] == [r.request_id for r in batch]
    for request, output in zip(batch, outputs, strict=True):
        # Batch invariant: conditioning rows and VAE decodes run per image, token GEMMs
        # are large-M.
        assert torch.equal(output.images, pipe(request).images)


@pytest.mark.parametrize(
    "other",
    [
        dict(max_sequence_length=32),
        dict(negative_prompt="dark", true_cfg_scale=3.0),
        dict(output_type="pt"),
    ],
)
def test_a_mixed_batch_is_refused(pipe: FluxPipeline, other: dict) -> None:
    # The scheduler's batch key is the contract: a batch that mixes keys is a caller
    # bug, not served.
    with pytest.raises(ValueError, match="one step key"):
        list(pipe.run([_req(seed=1), _req(seed=2, **other)]))


def test_output_types(pipe: FluxPipeline) -> None:
    latent = pipe(_req(output_type="latent", height=32, width=48))
    assert latent.images.shape == (1, 2 * 3, 64)
    pt = pipe(_req(output_type="pt", height=32, width=48))
    assert pt.images.shape == (1, 3, 32, 48) and pt.images.dtype == torch.float32
    assert pt.images.min() >= 0.0 and pt.images.max() <= 1.0


@pytest.mark.parametrize(
    "kw, param, text",
    [
        (
            dict(height=100),
            "height",
            "height=100 must be a positive multiple of 16 (e.g. 96)",
        ),
        (
            dict(num_inference_steps=0),
            "num_inference_steps",
            "num_inference_steps=0 must be an integer >= 1",
        ),
        (dict(n=0), "n", "n=0 must be an integer >= 1"),
    ],
)
def test_input_checks_name_value_and_fix(
    pipe: FluxPipeline, kw: dict, param: str, text: str
) -> None:
    with pytest.raises(RequestError) as info:
        list(pipe.run([_req(**kw)]))
    assert info.value.param == param and text in str(info.value)


def test_a_batch_of_two_geometries_runs_each_in_its_group(pipe: FluxPipeline) -> None:
    # Shapes are groups of one step-level batch (back to back within each step).
    batch = [library_admit(pipe, _req()), library_admit(pipe, _req(width=32))]
    events = list(pipe.run(batch))
    outputs = [o for e in events if isinstance(e, BatchResult) for o in e.outputs]
    assert sorted(tuple(o.images.shape) for o in outputs) == [
        (1, 64, 32, 3),
        (1, 64, 64, 3),
    ]


def test_long_prompt_warns_once_without_echo(
    tiny_flux_dir, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = FluxPipeline.from_pretrained(tiny_flux_dir)
    secret = "zebra " * 40 + "confidential"
    with caplog.at_level(logging.WARNING, logger="diffserve"):
        fresh(_req(prompt=secret, max_sequence_length=16))
        fresh(_req(prompt=secret, max_sequence_length=16, seed=3))
    t5_warnings = [
        r for r in caplog.records if "T5 window of 16 tokens" in r.getMessage()
    ]
    assert len(t5_warnings) == 1
    assert not any(
        "zebra" in r.getMessage() or "confidential" in r.getMessage()
        for r in caplog.records
    )


def test_flash_attn_fails_at_load_naming_what_is_missing(tiny_flux_dir) -> None:
    with pytest.raises(BackendUnavailableError, match="flash_attn") as info:
        FluxPipeline.from_pretrained(tiny_flux_dir, attention_backend="flash_attn")
    assert "CUDA device" in str(info.value)


def test_from_stage_reads_the_stage(tiny_flux_dir) -> None:
    config = resolve(
        model=str(tiny_flux_dir),
        deploy_config={
            "dtype": "auto",
            "linear_backend": "torch",
            "enforce_eager": True,
            "attention_backend": {"default": "sdpa", "single_block": "math"},
        },
        env={},
    )
    staged = FluxPipeline.from_stage(
        tiny_flux_dir, config.stage_for_role("diffusion"), BuildContext("cpu")
    )
    assert isinstance(staged, Pipeline)
    caps = staged.capabilities
    assert (caps.family, caps.size_multiple, caps.attention_roles) == (
        "FluxPipeline",
        16,
        ("double_block", "single_block"),
    )
    assert staged.dtype == torch.float32
    roles = {
        (m.role, m.backend_name)
        for m in staged.transformer.modules()
        if isinstance(m, Attention)
    }
    assert roles == {("double_block", "sdpa"), ("single_block", "math")}
