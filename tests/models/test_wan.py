"""The native Wan pipeline against plain diffusers on the same tiny directories, prompts
and seeds: Wan2.1 text-to-video, Wan2.2's two-expert MoE (the expert of every step is
diffusers' own switch) and Wan2.2 image-to-video; in float32 the latents the VAE decodes
to float32 rounding and the frames >= 60 dB (two implementations: their GEMMs may sum in
another order on another CPU kind, and the decoder's RMS norm is a running sum of
squares on CPU: models/vae_norm.py), bfloat16 >= 40 dB. Requests are checked against the
model's frames and sizes before any work."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError, ModelLoadError, RequestError
from diffserve.models.base import BuildContext, library_admit, run_one
from diffserve.models.wan.pipeline import WanVideoPipeline
from diffserve.types.request import GenerationRequest

REQUEST = dict(
    prompt="a red ball rolling to the left",
    negative_prompt="blurry",
    height=64,
    width=64,
    num_frames=9,
    num_inference_steps=2,
    guidance_scale=5.0,
    seed=7,
)
FIRST_FRAME = np.zeros((64, 64, 3), np.uint8)
FIRST_FRAME[16:48, 8:40] = (220, 40, 30)


def psnr(ours: np.ndarray, theirs: np.ndarray) -> float:
    mse = float(np.mean((ours.astype(np.float64) - theirs.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def recording_decodes(vae: Any, latents: list[torch.Tensor]) -> None:
    """Append the latents of each ``vae.decode`` call to ``latents``."""
    decode = vae.decode

    def recorded(z: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        latents.append(z.clone())
        return decode(z, *args, **kwargs)

    vae.decode = recorded


def ours(
    model_dir: Path,
    dtype: str,
    decoded: list[torch.Tensor] | None = None,
    **request: Any,
) -> tuple[np.ndarray, dict[str, Any]]:
    config = resolve(
        model=model_dir,
        overrides={"dtype": dtype, "linear_backend": "torch", "enforce_eager": True},
        env={},
    )
    pipeline = WanVideoPipeline.from_stage(
        model_dir, config.stage_for_role("diffusion"), BuildContext()
    )
    if decoded is not None:
        recording_decodes(pipeline.vae.vae, decoded)
    out = run_one(pipeline, GenerationRequest(**{**REQUEST, **request}))
    return out.images[0].numpy(), out.attestation


def diffusers_video(
    model_dir: Path,
    dtype: str,
    image: np.ndarray | None,
    decoded: list[torch.Tensor] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """diffusers' frames (as uint8, rounded as ours are) and the expert it ran at each
    step."""
    import diffusers
    from PIL import Image

    cls = (
        diffusers.WanImageToVideoPipeline
        if image is not None
        else diffusers.WanPipeline
    )
    pipe = cls.from_pretrained(model_dir, torch_dtype=getattr(torch, dtype))
    pipe.set_progress_bar_config(disable=True)
    if decoded is not None:
        recording_decodes(pipe.vae, decoded)
    ran: list[str] = []
    for name in ("transformer", "transformer_2"):
        module = getattr(pipe, name, None)
        # Once per step: the conditional forward (the unconditional one follows)
        if module is not None:
            module.register_forward_pre_hook(lambda _m, _a, name=name: ran.append(name))
    kwargs = {
        k: REQUEST[k]
        for k in (
            "prompt",
            "negative_prompt",
            "height",
            "width",
            "num_frames",
            "num_inference_steps",
            "guidance_scale",
        )
    }
    if image is not None:
        kwargs["image"] = Image.fromarray(image)
    frames = pipe(
        **kwargs,
        generator=torch.Generator().manual_seed(REQUEST["seed"]),
        output_type="np",
    ).frames[0]
    return (torch.from_numpy(frames) * 255).round().clamp(0, 255).to(
        torch.uint8
    ).numpy(), ran[::2]


@pytest.mark.numerics
@pytest.mark.parametrize(
    "model", ["tiny_wan_dir", "tiny_wan22_dir", "tiny_wan22_i2v_dir"]
)
def test_matches_diffusers_in_float32_and_bfloat16(
    model: str, request: pytest.FixtureRequest
) -> None:
    model_dir = request.getfixturevalue(model)
    image = FIRST_FRAME if "i2v" in model else None
    extra = {"images": (image,)} if image is not None else {}
    # Measured on AVX2 (AMD EPYC): float32 92.5 / 95.6 / inf dB, bfloat16 51.7-51.9 dB
    # (t2v / MoE / i2v).
    for dtype, floor in (("float32", 60.0), ("bfloat16", 40.0)):
        our_latents: list[torch.Tensor] = []
        their_latents: list[torch.Tensor] = []
        video, attestation = ours(model_dir, dtype, our_latents, **extra)
        reference, their_experts = diffusers_video(
            model_dir, dtype, image, their_latents
        )
        assert video.shape == reference.shape == (9, 64, 64, 3)
        assert psnr(video, reference) >= floor, (model, dtype, psnr(video, reference))
        assert len(our_latents) == len(their_latents) == 1
        if dtype == "float32":
            # Our Wan and diffusers' are two implementations (our Linear and attention
            # modules, diffusers' own): the same ops in the same order, so on AVX2 the
            # latents are equal bit for bit, but a CPU kind may pick other GEMM kernels
            # for the two. float32 rounding over two steps is ~1e-5 on latents of |x| <=
            # 17; bfloat16 misses by up to 0.06, so this still tells float32 parity
            # apart.
            torch.testing.assert_close(
                our_latents[0], their_latents[0], rtol=1e-4, atol=1e-3
            )
        experts = attestation["experts"]
        assert experts["steps"] == their_experts  # diffusers' switch, step for step
        two = model != "tiny_wan_dir"
        assert set(experts["forwards"]) == (
            {"transformer", "transformer_2"} if two else {"transformer"}
        )
        # CFG: two per step.
        assert sum(experts["forwards"].values()) == 2 * REQUEST["num_inference_steps"]
        # boundary 0.875 / 0.9 of 1000; the two steps' timesteps are 999 and 750: both
        # experts run
        if two:
            assert (
                experts["forwards"]["transformer"] > 0
                and experts["forwards"]["transformer_2"] > 0
            )


def test_requests_are_checked_against_the_model(
    tiny_wan22_i2v_dir: Path, tiny_wan_dir: Path
) -> None:
    config = resolve(
        model=tiny_wan_dir,
        overrides={"dtype": "float32", "enforce_eager": True},
        env={},
    )
    t2v = WanVideoPipeline.from_stage(
        tiny_wan_dir, config.stage_for_role("diffusion"), BuildContext()
    )
    with pytest.raises(
        RequestError, match=r"num_frames=8 must be 4k\+1 for this model \(e.g. 5\)"
    ) as info:
        library_admit(t2v, GenerationRequest(**{**REQUEST, "num_frames": 8}))
    assert info.value.param == "num_frames"
    with pytest.raises(RequestError, match="multiple of 16"):
        library_admit(t2v, GenerationRequest(**{**REQUEST, "height": 72}))
    with pytest.raises(RequestError, match="does not edit"):
        library_admit(t2v, GenerationRequest(**REQUEST, images=(FIRST_FRAME,)))
    # The family's defaults.
    admitted = library_admit(t2v, GenerationRequest(prompt="a ball"))
    assert (admitted.num_frames, admitted.fps, admitted.height, admitted.width) == (
        81,
        16,
        480,
        832,
    )
    assert (admitted.num_inference_steps, admitted.guidance_scale) == (50, 5.0)
    config = resolve(
        model=tiny_wan22_i2v_dir,
        overrides={"dtype": "float32", "enforce_eager": True},
        env={},
    )
    i2v = WanVideoPipeline.from_stage(
        tiny_wan22_i2v_dir, config.stage_for_role("diffusion"), BuildContext()
    )
    with pytest.raises(RequestError, match="send one") as info:
        library_admit(i2v, GenerationRequest(**REQUEST))
    assert info.value.param == "image"
    sized = library_admit(
        i2v,
        GenerationRequest(prompt="a ball", images=(np.zeros((70, 100, 3), np.uint8),)),
    )
    # The image's size, rounded down to the model's multiple.
    assert (sized.height, sized.width) == (64, 96)


def test_image_models_refuse_video_fields_and_wan_what_it_does_not_run(
    tiny_flux_dir: Path, tiny_wan_dir: Path
) -> None:
    from diffserve.models.flux.pipeline import FluxPipeline
    from diffserve.models.wan.params import WanParams

    flux = FluxPipeline.from_pretrained(tiny_flux_dir)
    with pytest.raises(
        RequestError, match="makes images; num_frames is for video models"
    ):
        library_admit(flux, GenerationRequest(prompt="a fox", num_frames=9))
    for overrides, message, path in (
        (
            {"cache": {"backend": "teacache"}},
            "no published polynomial fitted on this model",
            "cache.teacache_coefficients",
        ),
        (
            {"cache": {"backend": "teacache", "teacache_coefficients": "flux.1-dev"}},
            "fitted on FLUX.1-dev's modulated_input, which the "
            "wan denoiser does not have",
            "cache.teacache_coefficients",
        ),
        (
            {"quantization": "int8"},
            "quantization='int8' is not supported on Wan yet",
            "quantization",
        ),
    ):
        with pytest.raises(ConfigError, match=message) as error:
            wan = resolve(model=tiny_wan_dir, overrides=overrides, env={})
            WanVideoPipeline.from_stage(
                tiny_wan_dir, wan.stage_for_role("diffusion"), BuildContext()
            )
        assert error.value.path == f"stages.0.{path}"
    with pytest.raises(ModelLoadError, match="image_dim=1280"):
        WanParams.from_diffusers_config(
            {"image_dim": 1280, "num_attention_heads": 2}, "wan21-i2v"
        )


def test_first_block_cache_skips_per_video_and_computes_at_the_expert_switch(
    tiny_wan22_dir: Path,
) -> None:
    """fbcache on the two-expert model: at threshold 0 the video is the uncached one bit
    for bit; at a high one steps are skipped, each video of a request has its entry
    (both CFG branches), and the first step of the low-noise expert computes (its blocks
    never reuse the other expert's residual)."""
    config = resolve(
        model=tiny_wan22_dir,
        overrides={
            "dtype": "float32",
            "enforce_eager": True,
            "cache": {"backend": "fbcache"},
        },
        env={},
    )
    pipeline = WanVideoPipeline.from_stage(
        tiny_wan22_dir, config.stage_for_role("diffusion"), BuildContext()
    )
    base = {**REQUEST, "num_inference_steps": 8, "n": 2}
    uncached = run_one(pipeline, GenerationRequest(**base, cache_threshold=0.0))
    cached = run_one(pipeline, GenerationRequest(**base, cache_threshold=50.0))
    assert [e["skipped_steps"] for e in uncached.attestation["cache"]] == [0, 0]
    entries = cached.attestation["cache"]
    assert len(entries) == 2 and all(
        e["backend"] == "fbcache" and e["skipped_steps"] > 0 for e in entries
    )
    # The CFG branch decides alone.
    assert all(e["negative"]["skipped_steps"] > 0 for e in entries)
    # 0-based step of the switch.
    switch = cached.attestation["experts"]["steps"].index("transformer_2")
    for entry in entries:
        for branch in (entry, entry["negative"]):
            assert branch["trace"][switch][2] == "compute", branch["trace"]
    # A threshold no signal falls under: the cached path computes every step, op for op
    # the fused forward.
    every = run_one(pipeline, GenerationRequest(**base, cache_threshold=1e-12))
    assert every.attestation["cache"][0]["skipped_steps"] == 0
    assert np.array_equal(every.images.numpy(), uncached.images.numpy())
    assert not np.array_equal(cached.images.numpy(), uncached.images.numpy())


def test_teacache_skips_per_video_on_a_named_fit(tiny_wan_dir: Path) -> None:
    """TeaCache4Wan2.1 on a model without its own fit, the deploy naming the 1.3B one:
    steps are skipped per video and branch, attested with the polynomial's name; a
    threshold nothing falls under is the uncached video bit for bit. (The random tiny
    model's timestep MLP moves far more per step than the fitted checkpoint's, so its
    rescaled signals are large, hence the threshold; the 14B fit is negative there and
    computes every step: tests/config/test_teacache_polynomials.py.)"""
    config = resolve(
        model=tiny_wan_dir,
        overrides={
            "dtype": "float32",
            "enforce_eager": True,
            "cache": {
                "backend": "teacache",
                "teacache_coefficients": "wan2.1-t2v-1.3b",
                "max_threshold": 100,
            },
        },
        env={},
    )
    pipeline = WanVideoPipeline.from_stage(
        tiny_wan_dir, config.stage_for_role("diffusion"), BuildContext()
    )
    base = {**REQUEST, "num_inference_steps": 20}
    uncached = run_one(pipeline, GenerationRequest(**base, cache_threshold=0.0))
    cached = run_one(pipeline, GenerationRequest(**base, cache_threshold=100.0))
    (entry,) = cached.attestation["cache"]
    assert entry["backend"] == "teacache" and entry["coefficients"] == "wan2.1-t2v-1.3b"
    for branch in (entry, entry["negative"]):
        assert branch["skipped_steps"] > 0, branch["trace"]
        assert branch["trace"][0][2] == branch["trace"][-1][2] == "compute"
    every = run_one(pipeline, GenerationRequest(**base, cache_threshold=1e-12))
    assert every.attestation["cache"][0]["skipped_steps"] == 0
    assert np.array_equal(every.images.numpy(), uncached.images.numpy())
    assert not np.array_equal(cached.images.numpy(), uncached.images.numpy())
