"""Qwen-Image-2.1 on the generic path: its RGBA images against plain diffusers on the
same directory, seed and prompt (float32, >= 60 dB over all four channels), its prefix
KV cache used and attested per request (the first forward of each guidance branch
fills it, every later one reads it), and its text encodings through the exact
conditioning cache (a repeated prompt skips the Qwen3-VL encoder and makes the same
image)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from diffserve import Engine, GenerationRequest
from diffserve.errors import RequestError

PROMPT = "a glass teapot on a wooden table"
STEPS = 3


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def engine(tiny_qwen_image21_dir: Path) -> Any:
    with Engine(
        str(tiny_qwen_image21_dir),
        dtype="float32",
        linear_backend="torch",
        attention_backend="sdpa",
        env={},
    ) as eng:
        yield eng


@pytest.fixture(scope="module")
def plain(tiny_qwen_image21_dir: Path) -> Any:
    """Plain diffusers on the same directory (the Qwen3-VL processor handed in: without
    torchvision transformers cannot build it)."""
    import diffusers

    from diffserve.models.generic.vl_processor import load_qwen3_vl_processor

    pipe = diffusers.QwenImage21Pipeline.from_pretrained(
        str(tiny_qwen_image21_dir),
        torch_dtype=torch.float32,
        processor=load_qwen3_vl_processor(tiny_qwen_image21_dir / "processor"),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(engine: Any, **fields: Any) -> Any:
    request = dict(prompt=PROMPT, height=64, width=64, num_inference_steps=STEPS)
    return engine.generate(GenerationRequest(**{**request, "seed": 7, **fields}))


def reference(
    plain: Any, seed: int = 7, prompt: str = PROMPT, **kwargs: Any
) -> np.ndarray:
    image = plain(
        prompt=prompt,
        height=64,
        width=64,
        num_inference_steps=STEPS,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
        **kwargs,
    ).images[0]
    return (np.asarray(image) * 255).round().astype(np.uint8)


@pytest.mark.numerics
@pytest.mark.parametrize("guidance", [1.0, 4.0], ids=["unguided", "true-cfg"])
def test_rgba_images_match_plain_diffusers_and_the_prefix_cache_is_read(
    engine: Any, plain: Any, guidance: float
) -> None:
    out = generate(engine, guidance_scale=guidance, prompt=f"{PROMPT} {guidance}")
    image = out.images[0]
    assert image.mode == "RGBA" and image.size == (64, 64)
    cfg = {"true_cfg_scale": guidance}
    if guidance > 1:
        cfg["negative_prompt"] = " "  # what the engine sends (the model card's)
    want = reference(plain, **cfg, prompt=f"{PROMPT} {guidance}")
    assert want.shape == (64, 64, 4)
    assert psnr(np.asarray(image), want) >= 60.0
    # The alpha channel is the model's own, not a constant fill.
    assert np.asarray(image)[..., 3].std() > 0
    a = out.attestation
    assert (a["model_family"], a["implementation"]) == (
        "QwenImage21Pipeline",
        "generic",
    )
    branches = 2 if guidance > 1 else 1
    # Step 1 of each branch fills every block's text keys and values; the other steps
    # read them.
    assert a["prefix_kv_cache"] == {
        "prefills": branches,
        "hits": branches * (STEPS - 1),
        "uncached": 0,
    }
    assert a["transformer_forwards"] == branches * STEPS


@pytest.mark.numerics
def test_the_cache_reads_what_a_full_forward_would_compute(plain: Any) -> None:
    """The negative control of the prefix cache: diffusers' own uncached path
    (``use_kv_cache=False``: every step runs text and image through every block) makes
    the same picture, so the hits the engine attests skip work, not quality."""
    cached = reference(plain, seed=11)
    uncached = reference(plain, seed=11, use_kv_cache=False)
    assert psnr(cached, uncached) >= 60.0


def test_a_repeated_prompt_comes_from_the_conditioning_cache(engine: Any) -> None:
    prompt = "a paper lantern floating on a river"
    first = generate(engine, prompt=prompt)
    again = generate(engine, prompt=prompt)
    assert (
        first.attestation["conditioning_cache"],
        again.attestation["conditioning_cache"],
    ) == ("miss", "hit")
    # A hit holds what encoding the prompt alone gave: the same image, bit for bit.
    assert again.images[0].tobytes() == first.images[0].tobytes()
    state = again.attestation["conditioning_cache_state"]
    assert state["entries"] >= 1 and state["bytes"] > 0
    # A request may opt out: encoded afresh, the same image.
    off = generate(engine, prompt=prompt, conditioning_cache=False)
    assert off.attestation["conditioning_cache"] == "off"
    assert off.images[0].tobytes() == first.images[0].tobytes()
    # With true CFG the negative prompt is looked up too: a hit only when both are.
    negative = dict(guidance_scale=3.0, negative_prompt="a blurry lantern")
    guided = generate(engine, prompt=prompt, **negative)
    assert guided.attestation["conditioning_cache"] == "miss"
    guided_again = generate(engine, prompt=prompt, **negative)
    assert guided_again.attestation["conditioning_cache"] == "hit"


def test_sizes_off_its_grid_and_one_step_are_refused(engine: Any) -> None:
    with pytest.raises(RequestError, match="multiple of 32"):
        generate(engine, height=48, width=48)
    with pytest.raises(RequestError) as info:
        generate(engine, num_inference_steps=1)
    assert info.value.param == "num_inference_steps"
    # What the support matrix says it does not take: adapters and edits.
    with pytest.raises(RequestError) as info:
        generate(engine, loras=(("style", 1.0),))
    assert info.value.param == "loras"
    with pytest.raises(RequestError) as info:
        generate(engine, images=(np.zeros((64, 64, 3), np.uint8),))
    assert info.value.param == "image"
    assert generate(engine).images[0].mode == "RGBA"  # still serving
