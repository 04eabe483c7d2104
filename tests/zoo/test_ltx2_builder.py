"""The hermetic LTX-2 builder (tiny-ltx2): byte-identical rebuilds, and plain diffusers
loads what it writes and generates video frames with a real (24 kHz stereo) audio
track."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tree_files import tree_files

from diffserve.errors import ConfigError

WEIGHTS = {
    "text_encoder/model.safetensors",
    "connectors/diffusion_pytorch_model.safetensors",
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.safetensors",
    "audio_vae/diffusion_pytorch_model.safetensors",
    "vocoder/diffusion_pytorch_model.safetensors",
}


@pytest.fixture(scope="module")
def ltx2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffserve.zoo.ltx2 import build_ltx2_model

    return build_ltx2_model(
        "tiny-ltx2", tmp_path_factory.mktemp("ltx2") / "tiny-ltx2", seed=0
    )


def test_the_build_is_safetensors_with_its_marker(ltx2_dir: Path) -> None:
    files = set(tree_files(ltx2_dir))
    assert files >= WEIGHTS
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pth", ".ckpt"))]
    marker = json.loads((ltx2_dir / "diffserve_model.json").read_text())
    assert marker == {
        "builder_version": 1,
        "kind": "tiny-ltx2",
        "description": marker["description"],
        "pipeline": "LTX2Pipeline",
        "seed": 0,
        "random_weights": True,
    }
    index = json.loads((ltx2_dir / "model_index.json").read_text())
    assert index["text_encoder"] == ["transformers", "Gemma3ForConditionalGeneration"]
    assert index["vocoder"] == ["ltx2", "LTX2Vocoder"]


def test_rebuilds_are_byte_identical_and_the_seed_changes_every_weight(
    ltx2_dir: Path, tmp_path: Path
) -> None:
    from diffserve.zoo.ltx2 import build_ltx2_model

    again = tree_files(build_ltx2_model("tiny-ltx2", tmp_path / "again", seed=0))
    assert again == tree_files(ltx2_dir)
    other = tree_files(build_ltx2_model("tiny-ltx2", tmp_path / "other", seed=1))
    assert other.keys() == again.keys()
    assert {f for f in again if other[f] != again[f]} == WEIGHTS | {
        "diffserve_model.json"
    }


def test_a_bad_kind_or_seed_is_a_config_error(tmp_path: Path) -> None:
    from diffserve.zoo.ltx2 import build_ltx2_model

    with pytest.raises(ConfigError, match="unknown model"):
        build_ltx2_model("tiny-ltx3", tmp_path / "x")
    with pytest.raises(ConfigError, match="seed"):
        build_ltx2_model("tiny-ltx2", tmp_path / "x", seed=-1)
    assert not (tmp_path / "x").exists()


def test_the_tokenizer_is_laid_out_like_gemmas(ltx2_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ltx2_dir / "tokenizer")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == specials
    batch = tok(["a photo of a cat", "é"], padding="max_length", max_length=8)
    ids = batch.input_ids
    # <bos> first, left padding (the pipeline's masked mean relies on it), and each
    # corpus word one "▁word" token.
    assert tok.padding_side == "left"
    assert ids[0] == [0, 0, 2] + ids[0][3:]
    assert tok.convert_ids_to_tokens(ids[0][4:]) == ["▁photo", "▁of", "▁a", "▁cat"]
    # Byte fallback: any text round-trips.
    assert tok.decode(ids[1], skip_special_tokens=True) == "é"


def test_plain_diffusers_generates_video_and_audio(ltx2_dir: Path) -> None:
    import numpy as np
    import torch
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(ltx2_dir, torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    # The real checkpoint's geometry.
    assert pipe.vae_spatial_compression_ratio == 32
    assert pipe.vae_temporal_compression_ratio == 8
    assert (pipe.audio_sampling_rate, pipe.audio_hop_length) == (16000, 160)
    rate = pipe.vocoder.config.output_sampling_rate
    assert rate == 24000
    assert pipe.transformer.config.in_channels == 128
    assert pipe.text_encoder.config.text_config.num_hidden_layers + 1 == (
        pipe.connectors.config.text_proj_in_factor
    )

    num_frames, frame_rate = 9, 24.0  # 8k+1 frames; 64 px: the decoder's smallest
    out = pipe(
        prompt="a cat playing the piano",
        negative_prompt="blurry",
        height=64,
        width=64,
        num_frames=num_frames,
        frame_rate=frame_rate,
        num_inference_steps=2,  # 1 step gives NaN sigmas (shift_terminal)
        # CFG, STG (at a block that exists) and modality-isolation guidance: all three
        # extra transformer passes run.
        spatio_temporal_guidance_blocks=[1],
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    frames, audio = out.frames, out.audio
    assert isinstance(frames, np.ndarray) and frames.dtype == np.float32
    assert frames.shape == (1, num_frames, 64, 64, 3)
    assert np.isfinite(frames).all() and 0.0 <= frames.min() <= frames.max() <= 1.0
    assert frames.std() > 0

    # Audio: a float tensor (batch, stereo, samples) at the vocoder's rate, whatever
    # output_type; its length follows num_frames / frame_rate: round(seconds * 25)
    # latent frames, 4 mel frames each less the causal 3, 240 samples a mel frame.
    assert isinstance(audio, torch.Tensor) and audio.dtype == torch.float32
    latent_frames = round(num_frames / frame_rate * 16000 / 160 / 4)
    assert audio.shape == (1, 2, (4 * latent_frames - 3) * 240)
    assert audio.shape[-1] / rate == pytest.approx(num_frames / frame_rate, abs=0.06)
    assert torch.isfinite(audio).all() and audio.abs().max() <= 1.0
    assert audio.abs().max() > 0 and audio.std() > 0
