"""The generic path: diffusers' SD3, PixArt-Sigma and Qwen-Image pipelines with their
denoiser on our kernels.

Parity is against plain diffusers on the same directory, prompt and seed; the
attestation must show the backends the config chose, per role; seeds, abort at a step
boundary and compile behave as on FLUX.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from diffserve import Engine, GenerationRequest
from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError
from diffserve.models.base import library_admit
from diffserve.models.generic.pipeline import GenericPipeline
from diffserve.types.results import BatchResult, StepEvent

FAMILIES = {
    "sd3": ("tiny_sd3_dir", "StableDiffusion3Pipeline"),
    "pixart": ("tiny_pixart_dir", "PixArtSigmaPipeline"),
    "qwen": ("tiny_qwen_image_dir", "QwenImagePipeline"),
    "zimage": ("tiny_z_image_dir", "ZImagePipeline"),
    "klein": ("tiny_flux2_klein_dir", "Flux2KleinPipeline"),
    "flux2dev": ("tiny_flux2_dir", "Flux2Pipeline"),
}
PROMPT = "a red fox in the snow"


def psnr(a: np.ndarray, b: np.ndarray, peak: float = 255.0) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(peak**2 / mse)


def build(model_dir: Path, **fields: Any) -> GenericPipeline:
    fields = {
        "dtype": "float32",
        "linear_backend": "torch",
        "attention_backend": "sdpa",
        **fields,
    }
    stage = resolve(model=model_dir, overrides=fields, env={}).stages[0]
    return GenericPipeline.from_stage(model_dir, stage)


def diffusers_image(
    model_dir: Path,
    class_name: str,
    dtype: torch.dtype,
    seed: int,
    steps: int = 3,
    **kwargs: Any,
) -> np.ndarray:
    import diffusers

    from diffserve.models.generic.build import ensure_dtype
    from diffserve.models.generic.vl_processor import processor_components

    # What transformers cannot build here (no torchvision)
    processors = processor_components(model_dir)
    pipe = getattr(diffusers, class_name).from_pretrained(
        str(model_dir), torch_dtype=dtype, **dict.fromkeys(processors)
    )
    pipe.register_modules(**processors)
    pipe.set_progress_bar_config(disable=True)
    # Diffusers' own loader leaves SD3 in float32 without accelerate.
    ensure_dtype(pipe.transformer, dtype)
    if class_name == "PixArtSigmaPipeline":
        kwargs.update(use_resolution_binning=False, clean_caption=False)
    if class_name == "QwenImagePipeline":
        # Its model card's: without one the pipeline skips CFG.
        kwargs.setdefault("negative_prompt", " ")
    image = pipe(
        prompt=PROMPT,
        height=64,
        width=64,
        num_inference_steps=steps,  # keywords: klein's first is image
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
        **kwargs,
    ).images[0]
    return (image * 255).round()


def make_request(**fields: Any) -> GenerationRequest:
    return GenerationRequest(
        **{
            "prompt": PROMPT,
            "height": 64,
            "width": 64,
            "num_inference_steps": 3,
            "seed": 5,
            **fields,
        }
    )


@pytest.mark.numerics
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(("dtype", "floor_db"), [("float32", 60.0), ("bfloat16", 40.0)])
def test_images_match_plain_diffusers(
    family: str, dtype: str, floor_db: float, request: Any
) -> None:
    fixture, class_name = FAMILIES[family]
    model_dir = request.getfixturevalue(fixture)
    pipe = build(model_dir, dtype=dtype)
    ours = pipe(make_request(seed=5)).images[0].numpy()
    theirs = diffusers_image(model_dir, class_name, getattr(torch, dtype), seed=5)
    assert ours.shape == (64, 64, 3)
    assert psnr(ours, theirs) >= floor_db
    # The kernels the config chose ran: every denoiser Linear on torch, attention on
    # sdpa.
    counts = pipe.kernel_counters.snapshot()
    assert set(counts["linear"]) == {"torch"} and counts["linear"]["torch"] > 0
    assert set(counts["attention"]) == {"sdpa"} and counts["attention"]["sdpa"] > 0
    # One denoiser forward per step where diffusers batches the CFG branches, two where
    # it runs them apart (Qwen-Image's true CFG); guidance is the model's default.
    assert counts["transformer_forwards"] == (6 if family in ("qwen", "klein") else 3)
    assert (
        pipe.capabilities.implementation == "generic"
        and pipe.capabilities.family == class_name
    )


def test_no_plain_linear_left_and_weights_shared(tiny_sd3_dir: Path) -> None:
    from diffserve.layers.linear.module import Linear

    pipe = build(tiny_sd3_dir)
    modules = list(pipe.denoiser.modules())
    assert not [m for m in modules if type(m) is torch.nn.Linear]
    linears = [m for m in modules if isinstance(m, Linear)]
    assert linears and all(m.backend_name == "torch" for m in linears)
    # Weights are the loaded parameters themselves (one copy): the state dict still has
    # every key.
    keys = set(pipe.denoiser.state_dict())
    assert "transformer_blocks.0.attn.to_q.weight" in keys
    assert pipe.attention_roles and set(pipe.attention_roles.values()) == {
        "joint_block"
    }
    # Sizes are checked against the VAE factor x the patch size; the default is the
    # model's sample size.
    caps = pipe.capabilities
    assert (
        caps.size_multiple
        == pipe.pipe.vae_scale_factor * pipe.denoiser.config.patch_size
        == 16
    )
    assert (
        caps.default_size
        == pipe.denoiser.config.sample_size * pipe.pipe.vae_scale_factor
    )
    assert (
        caps.max_sequence_length == 256 and not caps.true_cfg and not caps.step_batching
    )


def test_per_role_attention_backends_on_pixart(tiny_pixart_dir: Path) -> None:
    pipe = build(
        tiny_pixart_dir,
        attention_backend={"default": "sdpa", "cross_attention": "math"},
    )
    assert set(pipe.attention_roles.values()) == {"self_attention", "cross_attention"}
    pipe(make_request(num_inference_steps=2))
    counts = pipe.kernel_counters.snapshot()["attention"]
    # Two blocks, each one self- and one cross-attention call per forward, two forwards.
    assert counts == {"sdpa": 4, "math": 4}


@pytest.mark.numerics
def test_generic_flux_equals_native_flux(tiny_flux_dir: Path) -> None:
    from diffserve.models.flux.pipeline import FluxPipeline

    generic = build(tiny_flux_dir, implementation="generic")
    native = FluxPipeline.from_pretrained(
        tiny_flux_dir, linear_backend="torch", attention_backend="sdpa"
    )
    req = make_request(num_inference_steps=2, max_sequence_length=64)
    # Two implementations of one model (diffusers' transformer on our kernels, and
    # ours): the same math in another order, so equal to rounding, not bit for bit
    # (84-89 dB, at most one level apart, on AVX2 and AMX).
    assert psnr(generic(req).images.numpy(), native(req).images.numpy()) >= 60.0
    assert generic.kernel_counters.snapshot()["attention"] == {"sdpa": 8}


def test_each_image_of_a_request_has_its_own_seed(tiny_sd3_dir: Path) -> None:
    pipe = build(tiny_sd3_dir)
    pair = pipe(make_request(seed=11, n=2))
    assert pair.seeds == [11, 12]
    for i, seed in enumerate(pair.seeds):
        alone = pipe(make_request(seed=seed)).images[0].numpy()
        # Same starting noise; the batch of 2 may round the last bits differently
        # (docs/models.md).
        assert psnr(pair.images[i].numpy(), alone) >= 45.0
    assert not torch.equal(pair.images[0], pair.images[1])


def test_step_events_and_abort_at_a_step_boundary(tiny_sd3_dir: Path) -> None:
    pipe = build(tiny_sd3_dir)
    run = pipe.run([library_admit(pipe, make_request(num_inference_steps=50))])
    events = [next(run), next(run)]
    assert events == [
        StepEvent(step=1, total_steps=50),
        StepEvent(step=2, total_steps=50),
    ]
    run.close()  # the pipeline thread stops at its next step callback
    assert pipe.kernel_counters.snapshot()["transformer_forwards"] <= 3
    # The pipeline is free again: a full request still runs to its result.
    events = list(pipe.run([library_admit(pipe, make_request(num_inference_steps=2))]))
    assert [type(e) for e in events] == [StepEvent, StepEvent, BatchResult]


def test_compiled_denoiser_counts_and_matches_eager(tiny_sd3_dir: Path) -> None:
    eager = build(tiny_sd3_dir)
    compiled = build(tiny_sd3_dir, enforce_eager=False)
    req = make_request(num_inference_steps=1)
    a, b = eager(req).images[0].numpy(), compiled(req).images[0].numpy()
    assert psnr(a, b) >= 40.0
    assert compiled.kernel_counters.snapshot() == eager.kernel_counters.snapshot()


def test_config_explain_names_the_generic_path_and_model_defaults(
    tiny_sd3_dir: Path,
    tiny_pixart_dir: Path,
    tiny_qwen_image_dir: Path,
    tiny_z_image_dir: Path,
    tiny_flux2_klein_dir: Path,
    tiny_flux2_dir: Path,
    tiny_qwen_image_edit_dir: Path,
) -> None:
    config = resolve(model=tiny_sd3_dir, env={})
    stage = config.stages[0]
    assert stage.implementation == "generic"
    assert (
        stage.request_defaults.num_inference_steps,
        stage.request_defaults.guidance_scale,
    ) == (28, 7.0)
    for key in (
        "implementation",
        "request_defaults.num_inference_steps",
        "request_defaults.guidance_scale",
    ):
        assert config.provenance[f"stages.0.{key}"].layer == "model"
    pixart = resolve(model=tiny_pixart_dir, env={}).stages[0].request_defaults
    assert (pixart.num_inference_steps, pixart.guidance_scale) == (20, 4.5)
    qwen = resolve(model=tiny_qwen_image_dir, env={})
    assert (
        qwen.stages[0].request_defaults.num_inference_steps,
        qwen.stages[0].request_defaults.guidance_scale,
    ) == (50, 4.0)
    assert qwen.provenance["stages.0.request_defaults.guidance_scale"].layer == "model"
    # The language-model families bring their __call__ defaults, source model.
    for model, defaults in (
        (tiny_z_image_dir, (50, 5.0)),
        (tiny_flux2_klein_dir, (50, 4.0)),
        (tiny_flux2_dir, (50, 4.0)),
        (tiny_qwen_image_edit_dir, (50, 4.0)),
    ):
        resolved = resolve(model=model, env={})
        filled = resolved.stages[0].request_defaults
        assert (filled.num_inference_steps, filled.guidance_scale) == defaults
        for key in (
            "implementation",
            "request_defaults.num_inference_steps",
            "request_defaults.guidance_scale",
        ):
            assert resolved.provenance[f"stages.0.{key}"].layer == "model"
    # A deploy value beats the model's.
    mine = resolve(
        model=tiny_sd3_dir, overrides={"default_guidance_scale": 5.0}, env={}
    )
    assert mine.stages[0].request_defaults.guidance_scale == 5.0
    assert mine.provenance["stages.0.request_defaults.guidance_scale"].layer == "cli"


def test_native_on_a_generic_only_family_is_refused(tiny_sd3_dir: Path) -> None:
    with pytest.raises(ConfigError, match="no native implementation") as info:
        resolve(model=tiny_sd3_dir, overrides={"implementation": "native"}, env={})
    assert "stages.0.implementation" in str(info.value)


def test_non_dit_pipeline_class_is_refused_listing_supported(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text(
        '{"_class_name": "StableDiffusionPipeline"}'
    )
    with pytest.raises(ConfigError) as info:
        resolve(model=tmp_path, env={})
    message = str(info.value)
    assert "StableDiffusionPipeline" in message
    for supported in (
        "FluxPipeline",
        "StableDiffusion3Pipeline",
        "PixArtSigmaPipeline",
    ):
        assert supported in message


def test_engine_acceptance_sd3_torch_sdpa(tiny_sd3_dir: Path) -> None:
    """The issue's acceptance line, through the engine; also the model's defaults reach
    the request."""
    with Engine(
        str(tiny_sd3_dir),
        linear_backend="torch",
        attention_backend="sdpa",
        dtype="float32",
    ) as engine:
        out = engine.generate(
            GenerationRequest(
                prompt=PROMPT, height=64, width=64, num_inference_steps=2, seed=1
            )
        )
        assert (
            out.attestation["linear"]["torch"] > 0
            and out.attestation["attention"]["sdpa"] > 0
        )
        assert out.attestation["implementation"] == "generic"
        assert out.guidance_scale == 7.0  # SD3's default, source model
        assert out.images[0].size == (64, 64)


def test_the_compute_thread_ends_with_its_pipeline(tiny_sd3_dir: Path) -> None:
    # A thread left behind would keep its OpenMP team and slow every later torch op of
    # the process.
    import gc
    import threading

    pipe = build(tiny_sd3_dir)
    pipe(make_request(num_inference_steps=1))
    ident = pipe.compute.ident

    def alive() -> bool:
        return any(t.ident == ident for t in threading.enumerate())

    assert ident is not None and alive()
    del pipe
    gc.collect()
    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive()


# W8A8 int8 per language-model family: its fixture, the request beyond make_request's
# (a video's frames; HunyuanVideo-1.5 at 32x32, its text window short) and what one
# request returns: [frames,] height, width, channels.
INT8_FAMILIES: dict[str, tuple[str, dict[str, Any], tuple[int, ...]]] = {
    "qwen": ("tiny_qwen_image_dir", {}, (64, 64, 3)),
    "zimage": ("tiny_z_image_dir", {}, (64, 64, 3)),
    "klein": ("tiny_flux2_klein_dir", {}, (64, 64, 3)),
    "flux2dev": ("tiny_flux2_dir", {}, (64, 64, 3)),
    "qwen21": ("tiny_qwen_image21_dir", {}, (64, 64, 4)),  # RGBA
    "ltx2": ("tiny_ltx2_dir", {"num_frames": 9, "fps": 24}, (9, 64, 64, 3)),
    "hunyuan15": (
        "tiny_hunyuan_video15_dir",
        dict(height=32, width=32, num_frames=5, max_sequence_length=32),
        (5, 32, 32, 3),
    ),
}


@pytest.mark.parametrize("family", list(INT8_FAMILIES))
def test_int8_quantization_runs_on_the_language_model_families(
    family: str, request: Any
) -> None:
    # The support matrix claims every quantization method for every family; W8A8 int8 on
    # the new ones here, against the same request in float32: the image (a video: all
    # its frames) within the 40 dB bfloat16 is held to, LTX-2's audio too.
    fixture, fields, shape = INT8_FAMILIES[family]
    model_dir = request.getfixturevalue(fixture)
    want = build(model_dir)(make_request(num_inference_steps=2, **fields))
    pipe = build(model_dir, quantization="int8")
    got = pipe(make_request(num_inference_steps=2, **fields))
    frames = got.images[0].numpy()
    assert frames.shape == shape and frames.std() > 0
    assert psnr(frames, want.images[0].numpy()) >= 40.0
    assert (got.audio is not None) == (family == "ltx2")
    if got.audio is not None:
        # The waveforms [n, channels, samples] in [-1, 1]: the same sound.
        assert got.audio.shape == want.audio.shape and got.audio.shape[1] == 2
        assert psnr(got.audio, want.audio, peak=2.0) >= 40.0
    counts = pipe.kernel_counters.snapshot()["linear"]
    assert counts.get("int8_dynamic", 0) > 0, counts
    assert pipe.weights["transformer"].quantization is not None
