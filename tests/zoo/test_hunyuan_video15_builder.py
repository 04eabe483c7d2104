"""The hermetic HunyuanVideo-1.5 builder (tiny-hunyuan-video-15): plain diffusers loads
and runs what it writes, the real geometry, the prompt template's crop, safetensors
only, byte-identical rebuilds, bad arguments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tree_files import tree_files

from diffserve.errors import ConfigError

KIND = "tiny-hunyuan-video-15"
WEIGHTS = {
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.safetensors",
    "text_encoder/model.safetensors",
    "text_encoder_2/model.safetensors",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffserve.zoo.hunyuan_video15 import build_hunyuan_video15_model

    return build_hunyuan_video15_model(
        KIND, tmp_path_factory.mktemp("hunyuan-video-15") / KIND, seed=0
    )


@pytest.fixture(scope="module")
def pipe(model_dir: Path) -> Any:
    import torch
    from diffusers import HunyuanVideo15Pipeline

    pipeline = HunyuanVideo15Pipeline.from_pretrained(
        model_dir, torch_dtype=torch.float32
    )
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def test_plain_diffusers_loads_and_generates(model_dir: Path, pipe: Any) -> None:
    import numpy as np
    import torch

    index = json.loads((model_dir / "model_index.json").read_text())
    assert index["_class_name"] == "HunyuanVideo15Pipeline"
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLTextModel"]
    assert index["guider"] == ["diffusers", "ClassifierFreeGuidance"]
    p = pipe
    assert type(p.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    assert p.scheduler.config.shift == 5.0
    assert p.guider.config.guidance_scale == 6.0
    # The real geometry: 16x / 4x VAE compression, 32 latent channels, 65 transformer
    # inputs (latents, condition latents, mask), text widths wired through.
    assert (p.vae_scale_factor_spatial, p.vae_scale_factor_temporal) == (16, 4)
    tr = p.transformer.config
    assert p.num_channels_latents == tr.out_channels == 32
    assert tr.in_channels == 65 and (tr.patch_size, tr.patch_size_t) == (1, 1)
    assert tr.text_embed_dim == p.text_encoder.config.hidden_size
    assert tr.text_embed_2_dim == p.text_encoder_2.config.d_model
    assert sum(tr.rope_axes_dim) == tr.attention_head_dim

    out = p(
        "a cat walks on the grass",
        height=32,
        width=48,
        num_frames=5,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    frames = out.frames
    assert frames.shape == (1, 5, 32, 48, 3) and frames.dtype == np.float32
    assert np.isfinite(frames).all() and frames.std() > 0
    assert frames.min() >= 0.0 and frames.max() <= 1.0


def test_system_turn_is_the_real_template_length(pipe: Any) -> None:
    """The pipeline crops 108 tokens (the real tokenizer's system turn plus
    ``<|im_start|>user\\n``) off the hidden states: the tiny tokenizer's crop ends at
    the same place, so the prompt is what stays."""
    from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import (
        format_text_input,
    )

    from diffserve.zoo.hunyuan_video15_specs import SYSTEM_MESSAGE, TEMPLATE_CROP_START

    p = pipe
    assert p.system_message == SYSTEM_MESSAGE
    assert p.prompt_template_encode_start_idx == TEMPLATE_CROP_START == 108
    tokenizer = p.tokenizer
    ids = tokenizer.apply_chat_template(
        format_text_input(["a cat walks"], SYSTEM_MESSAGE),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"][0]
    assert tokenizer.decode(ids[:108]).endswith("<|im_start|>user\n")
    assert tokenizer.decode(ids[108:]).startswith("a cat walks<|im_end|>")


def test_weights_are_safetensors_only(model_dir: Path) -> None:
    files = set(tree_files(model_dir))
    assert {f for f in files if f.endswith(".safetensors")} == WEIGHTS
    assert not [
        f for f in files if f.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    ]
    marker = json.loads((model_dir / "diffserve_model.json").read_text())
    assert marker == {
        "builder_version": 1,
        "kind": KIND,
        "description": marker["description"],
        "pipeline": "HunyuanVideo15Pipeline",
        "seed": 0,
        "random_weights": True,
    }


def test_same_seed_identical_other_seed_changes_weights(
    tmp_path: Path, model_dir: Path
) -> None:
    import torch

    from diffserve.zoo.hunyuan_video15 import build_hunyuan_video15_model

    base = tree_files(model_dir)
    torch.manual_seed(1234)
    rng_before = torch.random.get_rng_state()
    again = tree_files(build_hunyuan_video15_model(KIND, tmp_path / "again", seed=0))
    assert torch.equal(rng_before, torch.random.get_rng_state())
    assert sorted(again) == sorted(base)
    assert [name for name in base if base[name] != again[name]] == []
    other = tree_files(build_hunyuan_video15_model(KIND, tmp_path / "seed1", seed=1))
    assert sorted(other) == sorted(base)
    assert {name for name in base if base[name] != other[name]} == {
        *WEIGHTS,
        "diffserve_model.json",
    }


def test_bad_arguments_raise_config_error(tmp_path: Path, model_dir: Path) -> None:
    from diffserve.zoo.hunyuan_video15 import build_hunyuan_video15_model

    with pytest.raises(ConfigError, match="unknown model 'huge-hunyuan'"):
        build_hunyuan_video15_model("huge-hunyuan", tmp_path / "a")
    for seed in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="seed"):
            build_hunyuan_video15_model(KIND, tmp_path / "a", seed=seed)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not empty"):
        build_hunyuan_video15_model(KIND, model_dir)
    assert list(tmp_path.iterdir()) == []
