"""The hermetic Qwen-Image-2.1 builder (tiny-qwen-image-21): byte-identical rebuilds,
safetensors only, the real checkpoint's layout and geometry, and plain diffusers
``QwenImage21Pipeline.from_pretrained(dir)`` loading and running it: RGBA images, the
prefix KV cache, an image-conditioned call.

Without torchvision (absent here) transformers cannot build the ``Qwen3VLProcessor``
that the real checkpoint's ``processor/`` names (its video processor needs
torchvision), so, as tests/zoo/test_plain_diffusers_loads.py does for the Qwen2-VL
processor, the marker is checked to name it, a load without it to fail, and its
image-only twin is handed in.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tree_files import tree_files

from diffserve.errors import ConfigError

KIND = "tiny-qwen-image-21"
SIZE = 64
PROMPT = "a red circle on a blue background"
WEIGHTS = {
    "text_encoder/model.safetensors",
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.safetensors",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffserve.zoo.qwen_image21 import build_qwen_image21_model

    return build_qwen_image21_model(
        KIND, tmp_path_factory.mktemp("qwen21") / KIND, seed=0
    )


@pytest.fixture(scope="module")
def pipe(model_dir: Path) -> Any:
    """The pipeline as a user loads it: ``from_pretrained(dir)``; without torchvision,
    with the processor the marker names handed in."""
    import torch
    from diffusers import QwenImage21Pipeline

    from diffserve.models.generic.vl_processor import load_qwen3_vl_processor

    marker = json.loads((model_dir / "diffserve_model.json").read_text())
    assert marker["needs_torchvision"] == {"processor": "Qwen3VLProcessor"}
    supplied: dict[str, Any] = {}
    if importlib.util.find_spec("torchvision") is None:
        with pytest.raises((ImportError, ValueError)):
            QwenImage21Pipeline.from_pretrained(str(model_dir))
        supplied["processor"] = load_qwen3_vl_processor(model_dir / "processor")
    loaded = QwenImage21Pipeline.from_pretrained(
        str(model_dir), torch_dtype=torch.float32, **supplied
    )
    loaded.set_progress_bar_config(disable=True)
    return loaded


def _call(pipe: Any, **kwargs: Any) -> Any:
    import torch

    args: dict[str, Any] = {
        "prompt": PROMPT,
        "height": SIZE,
        "width": SIZE,
        "num_inference_steps": 2,
        "generator": torch.Generator().manual_seed(0),
        **kwargs,
    }
    return pipe(**args).images


def test_rebuild_is_byte_identical_and_the_seed_changes_only_weights(
    model_dir: Path, tmp_path: Path
) -> None:
    from diffserve.zoo.qwen_image21 import build_qwen_image21_model

    files = tree_files(model_dir)
    assert set(files) >= WEIGHTS
    assert not [
        name
        for name in files
        if name.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    ]
    assert (
        tree_files(build_qwen_image21_model(KIND, tmp_path / "again", seed=0)) == files
    )
    other = tree_files(build_qwen_image21_model(KIND, tmp_path / "other", seed=1))
    assert other.keys() == files.keys()
    changed = {name for name in files if other[name] != files[name]}
    assert changed == WEIGHTS | {"diffserve_model.json"}


def test_layout_and_geometry_are_the_real_checkpoints(model_dir: Path) -> None:
    def read(name: str) -> dict[str, Any]:
        return json.loads((model_dir / name).read_text())

    index = read("model_index.json")
    assert index["_class_name"] == "QwenImage21Pipeline"
    assert index["processor"] == ["transformers", "Qwen3VLProcessor"]
    assert index["text_encoder"] == ["transformers", "Qwen3VLForConditionalGeneration"]
    assert index["sample_sigmas"] is None  # the base model: num_inference_steps rules
    marker = read("diffserve_model.json")
    assert (marker["kind"], marker["seed"], marker["random_weights"]) == (KIND, 0, True)
    assert marker["pipeline"] == "QwenImage21Pipeline"
    transformer = read("transformer/config.json")
    assert (transformer["patch_size"], transformer["in_channels"]) == (1, 64)
    assert transformer["causal_condition"] is True
    vae = read("vae/config.json")
    assert (vae["z_dim"], vae["in_channels"], vae["out_channels"]) == (64, 4, 4)
    assert len(vae["dim_mult"]) == 5 and vae["scale_factor_spatial"] == 16
    scheduler = read("scheduler/scheduler_config.json")
    assert scheduler["use_dynamic_shifting"] and scheduler["shift_terminal"] == 0.02
    processor = read("processor/preprocessor_config.json")
    assert (processor["patch_size"], processor["merge_size"]) == (16, 2)
    assert (model_dir / "processor/video_preprocessor_config.json").is_file()


def test_plain_diffusers_generates_rgba(pipe: Any) -> None:
    # The system block the pipeline drops is the chat template's rendering of its
    # system prompt, one token per word as in the real vocabulary.
    assert pipe._drop_idx == 12 and pipe.vae_scale_factor == 16
    image = _call(pipe)[0]
    assert (image.mode, image.size) == ("RGBA", (SIZE, SIZE))
    array = _call(pipe, output_type="np")
    assert array.shape == (1, SIZE, SIZE, 4)
    assert np.isfinite(array).all() and 0.0 <= array.min() <= array.max() <= 1.0
    assert array.std() > 0
    tensor = _call(pipe, output_type="pt")
    assert tuple(tensor.shape) == (1, 4, SIZE, SIZE)
    # The same seed, the same image (PIL's alpha is the array's fourth channel).
    np.testing.assert_array_equal(
        np.asarray(image)[..., 3], (array[0, ..., 3] * 255).round().astype(np.uint8)
    )


def test_prefix_kv_cache_is_filled_once_and_read_every_later_step(pipe: Any) -> None:
    """``causal_condition``: the first step stores the text tokens' keys and values,
    the later ones read them (one cache per guidance branch); without the cache the
    image is the same in float32."""
    modes: list[str | None] = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: modes.append(kwargs.get("kv_cache_mode")),
        with_kwargs=True,
    )
    try:
        cached = _call(pipe, num_inference_steps=3, output_type="np")
        assert modes == ["extract", "cached", "cached"]
        modes.clear()
        uncached = _call(
            pipe, num_inference_steps=3, output_type="np", use_kv_cache=False
        )
        assert modes == [None, None, None]
        modes.clear()
        _call(pipe, negative_prompt="blurry", true_cfg_scale=4.0, output_type="np")
        assert modes == ["extract", "extract", "cached", "cached"]
    finally:
        hook.remove()
    np.testing.assert_allclose(cached, uncached, atol=1e-4)


def test_encode_prompt_and_an_image_conditioned_call(pipe: Any) -> None:
    from PIL import Image

    embeds, mask, image_pads = pipe.encode_prompt(["a cat", PROMPT])
    assert embeds.shape[0] == 2 and embeds.shape[2] == 64
    assert mask is not None and mask.shape == image_pads.shape == embeds.shape[:2]
    assert not image_pads.any()
    # A condition image goes through the processor's image path (the twin's, here)
    # and the VAE's encoder; 256: the processor's smallest area (65536 pixels), below
    # which its vision slots no longer match the VAE's latent tokens. Two steps: one
    # gives NaN sigmas (shift_terminal stretches the single sigma 1.0 by 0 / 0).
    condition = Image.fromarray(
        (np.random.default_rng(0).random((SIZE, SIZE, 4)) * 255).astype(np.uint8),
        "RGBA",
    )
    array = _call(pipe, image=condition, output_resolution=256, output_type="np")
    assert array.shape == (1, SIZE, SIZE, 4) and np.isfinite(array).all()


def test_bad_arguments(tmp_path: Path) -> None:
    from diffserve.zoo.qwen_image21 import build_qwen_image21_model

    with pytest.raises(ConfigError, match="unknown model"):
        build_qwen_image21_model("tiny-qwen-image-22", tmp_path / "x")
    with pytest.raises(ConfigError, match="seed"):
        build_qwen_image21_model(KIND, tmp_path / "y", seed=-1)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
