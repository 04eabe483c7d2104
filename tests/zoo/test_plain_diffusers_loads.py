"""Every ``diffserve make-model`` output loads and runs in plain diffusers, as a user
would run it: the pipeline class ``model_index.json`` names, ``from_pretrained(dir)``
with nothing else, then ``__call__`` at 64x64 for one or two steps (a reference image
for the edit and image-to-video kinds); an adapter kind goes through
``load_lora_weights`` on its base model. The list of kinds here is make-model's own (a
new kind cannot skip this).

Without torchvision (absent here: no PyPI build of it sits beside every CPU torch
release) transformers cannot build two processor classes that real checkpoints name and
our builders therefore write too: ``Qwen2VLProcessor`` (the Qwen-Image-Edit kinds'
``processor/``: transformers builds it with a ``Qwen2VLVideoProcessor``, which needs
torchvision) and ``PixtralProcessor`` (tiny-flux2's ``tokenizer/``: its module imports
the torchvision ``PixtralImageProcessor``). A plain ``from_pretrained(dir)`` then stops
at that component (an ImportError, or for Pixtral a ValueError about a placeholder
class), so there the builder names it in the marker file (``needs_torchvision``) and
these tests hand exactly that component in, as such a user must:
``processor_components`` loads the same files without torchvision (the Qwen2-VL
processor's image-only twin; Pixtral's tokenizer, all FLUX.2-dev's text-to-image prompts
use), and the pipeline takes it through ``register_modules`` (``from_pretrained(dir,
tokenizer=obj)`` would fail diffusers' class check against the placeholder).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# Kinds the suite's session fixtures (tests/conftest.py) already build: taken from
# there, never built twice.
FIXTURES = {
    "tiny-flux": "tiny_flux_dir",
    "tiny-flux-kontext": "tiny_flux_kontext_dir",
    "small-flux": "small_flux_dir",
    "tiny-sd3": "tiny_sd3_dir",
    "tiny-pixart-sigma": "tiny_pixart_dir",
    "tiny-qwen-image": "tiny_qwen_image_dir",
    "tiny-qwen-image-edit": "tiny_qwen_image_edit_dir",
    "tiny-qwen-image-edit-plus": "tiny_qwen_image_edit_plus_dir",
    "tiny-z-image": "tiny_z_image_dir",
    "tiny-flux2-klein": "tiny_flux2_klein_dir",
    "tiny-flux2": "tiny_flux2_dir",
    "tiny-wan": "tiny_wan_dir",
    "tiny-wan22": "tiny_wan22_dir",
    "tiny-wan22-i2v": "tiny_wan22_i2v_dir",
}
# No test else builds them: this module does, once each.
BUILT_HERE = ("small-sd3", "small-wan")
# make-model copies the shipped trained models byte for byte (test_toy_shapes.py /
# test_toy_motion.py check the copy), so the shipped directories are what it writes.
SHIPPED = ("toy-shapes", "toy-motion")
ADAPTERS = ("tiny-flux-lora", "toy-shapes-stars")  # LoRAs: loaded onto their base model
# Causal LMs for AR stages, not diffusers pipelines: transformers and vLLM load them
# (tests/zoo/test_llm_models.py).
LANGUAGE_MODELS = ("tiny-qwen3", "tiny-qwen3-moe", "toy-prompter")
# Families whose tiny builder has a test of its own that loads and runs it in plain
# diffusers, with the calls their pipelines need (RGBA images, a video's audio track,
# LTX-2's 8k+1 frames): not run twice.
TESTED_BY_THEIR_BUILDER = {
    "tiny-qwen-image-21": "test_qwen_image21_builder.py",
    "tiny-ltx2": "test_ltx2_builder.py",
    "tiny-hunyuan-video-15": "test_hunyuan_video15_builder.py",
}
MODELS = (*FIXTURES, *BUILT_HERE, *SHIPPED)

# ~100M parameters: one step is enough to run every module.
SMALL = {"small-flux", "small-sd3", "small-wan"}
IMAGE_KINDS = {
    "tiny-flux-kontext",
    "tiny-qwen-image-edit",
    "tiny-qwen-image-edit-plus",
    "tiny-wan22-i2v",
}
VIDEO_KINDS = {"tiny-wan", "tiny-wan22", "tiny-wan22-i2v", "small-wan", "toy-motion"}
# Video kinds: the Wan VAE's 4x temporal compression makes that two latent frames.
FRAMES = 5
# A 128-token text window where the pipeline takes one: most pad the prompt to 512
# tokens, which is most of a tiny model's time (FLUX.2-klein: two passes of a 27-layer
# encoder), and the check is that every module runs. Not for the Qwen-Image-Edit kinds:
# their prompt carries the image's vision tokens, which a window would cut.
TEXT_TOKENS = 128
WHOLE_PROMPT = {"tiny-qwen-image-edit", "tiny-qwen-image-edit-plus"}
PROMPT = "a red circle on a blue background"
SIZE = 64


def test_the_kinds_here_are_make_models_kinds() -> None:
    from diffserve.entrypoints.commands import make_model

    subparsers = argparse.ArgumentParser().add_subparsers()
    make_model.register(subparsers)
    kinds = next(
        action.choices
        for action in subparsers.choices["make-model"]._actions
        if action.dest == "kind"
    )
    assert sorted(kinds) == sorted(
        (*MODELS, *TESTED_BY_THEIR_BUILDER, *ADAPTERS, *LANGUAGE_MODELS)
    )
    for test_file in TESTED_BY_THEIR_BUILDER.values():
        source = (Path(__file__).parent / test_file).read_text(encoding="utf-8")
        assert ".from_pretrained(" in source and "def test_" in source, test_file
    assert len(set(MODELS) | set(ADAPTERS)) == len(MODELS) + len(ADAPTERS)


@pytest.fixture(scope="module")
def build_here(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A kind no session fixture builds, built on first use (the builders make-model
    itself calls, seed 0)."""
    built: dict[str, Path] = {}

    def build(kind: str) -> Path:
        if kind not in built:
            from diffserve.zoo.generic import build_generic_model
            from diffserve.zoo.wan import build_wan_model

            builder = build_wan_model if kind.endswith("-wan") else build_generic_model
            built[kind] = builder(kind, tmp_path_factory.mktemp("plain") / kind, seed=0)
        return built[kind]

    return build


def _model_dir(
    kind: str, request: pytest.FixtureRequest, build_here: Callable[[str], Path]
) -> Path:
    if kind in FIXTURES:
        return Path(request.getfixturevalue(FIXTURES[kind]))
    if kind == "toy-shapes":
        from diffserve.zoo.demo import toy_model_dir

        return toy_model_dir()
    if kind == "toy-motion":
        from diffserve.zoo.wan import toy_motion_dir

        return toy_motion_dir()
    return build_here(kind)


def _plain_pipeline(model_dir: Path) -> Any:
    """The pipeline as a user loads it: ``from_pretrained(dir)`` alone; without
    torchvision, with the components the builder names as needing it handed in (see the
    module docstring), after checking the name is right: the plain load stops there, and
    those are all the processors transformers cannot build here."""
    import diffusers

    from diffserve.models.generic.vl_processor import processor_components

    index = json.loads((model_dir / "model_index.json").read_text(encoding="utf-8"))
    marker = json.loads(
        (model_dir / "diffserve_model.json").read_text(encoding="utf-8")
    )
    pipeline_class = getattr(diffusers, index["_class_name"])
    supplied: dict[str, Any] = {}
    if importlib.util.find_spec("torchvision") is None:
        supplied = processor_components(model_dir)
        assert {name: index[name][-1] for name in supplied} == marker.get(
            "needs_torchvision", {}
        )
        if supplied:
            with pytest.raises((ImportError, ValueError)):
                pipeline_class.from_pretrained(str(model_dir))
    pipe = pipeline_class.from_pretrained(str(model_dir), **dict.fromkeys(supplied))
    pipe.register_modules(**supplied)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _run(kind: str, pipe: Any) -> np.ndarray:
    """One call at 64x64 (``output_type="np"``); the images, or a video's frames, as an
    array."""
    import torch
    from PIL import Image

    kwargs: dict[str, Any] = {}
    if (
        "max_sequence_length" in inspect.signature(pipe.__call__).parameters
        and kind not in WHOLE_PROMPT
    ):
        kwargs["max_sequence_length"] = TEXT_TOKENS
    if kind in IMAGE_KINDS:
        kwargs["image"] = Image.fromarray(
            (np.random.default_rng(0).random((SIZE, SIZE, 3)) * 255).astype(np.uint8)
        )
    # Else Kontext picks its preferred ~1 MP size from the image's aspect ratio.
    if kind == "tiny-flux-kontext":
        kwargs.update(max_area=SIZE * SIZE, _auto_resize=False)
    # Else it runs at its nearest 256 px bin; clean_caption needs bs4 and ftfy.
    if kind == "tiny-pixart-sigma":
        kwargs.update(use_resolution_binning=False, clean_caption=False)
    if kind in VIDEO_KINDS:
        kwargs["num_frames"] = FRAMES
    out = pipe(
        prompt=PROMPT,
        height=SIZE,
        width=SIZE,
        num_inference_steps=1 if kind in SMALL else 2,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
        **kwargs,
    )
    return np.asarray(out.frames if kind in VIDEO_KINDS else out.images)


def _check(array: np.ndarray, *, video: bool) -> None:
    assert array.shape == ((1, FRAMES, SIZE, SIZE, 3) if video else (1, SIZE, SIZE, 3))
    assert np.isfinite(array).all() and array.min() >= 0.0 and array.max() <= 1.0
    # A picture, not a constant (a NaN-guarded or all-black decode would be)
    assert array.std() > 0


@pytest.mark.parametrize("kind", MODELS)
def test_plain_diffusers_runs_it(
    kind: str, request: pytest.FixtureRequest, build_here: Callable[[str], Path]
) -> None:
    """``from_pretrained(dir)`` and one call give a finite, non-constant 64x64 image (or
    5-frame video). Where torchvision is missing, the components transformers cannot
    build without it (tiny-flux2's PixtralProcessor, the Qwen-Image-Edit kinds'
    Qwen2VLProcessor: module docstring) are handed in as such a user must, once the
    marker is checked to name exactly those and a load without them is checked to
    fail."""
    model_dir = _model_dir(kind, request, build_here)
    pipe = _plain_pipeline(model_dir)
    _check(_run(kind, pipe), video=kind in VIDEO_KINDS)


@pytest.mark.parametrize("kind", ADAPTERS)
def test_plain_diffusers_applies_the_adapter(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The adapter kinds: ``load_lora_weights(dir)`` on the base model they were made
    for changes its image."""
    if kind == "tiny-flux-lora":
        from diffserve.zoo.lora import build_flux_lora

        base = Path(request.getfixturevalue("tiny_flux_dir"))
        # Make-model's defaults: seed 0, rank 4.
        adapter = build_flux_lora(base, tmp_path / kind, seed=0).parent
    else:
        from diffserve.zoo.demo import toy_model_dir
        from diffserve.zoo.toy_shapes.lora import shipped_stars_lora

        # What make-model copies.
        base, adapter = (toy_model_dir(), shipped_stars_lora().parent)
    pipe = _plain_pipeline(base)
    before = _run(kind, pipe)
    pipe.load_lora_weights(str(adapter))
    assert pipe.get_active_adapters() == ["default_0"]
    after = _run(kind, pipe)
    _check(after, video=False)
    assert np.abs(after - before).max() > 1e-3
