"""The hermetic generic diffusers DiT builders (tiny-sd3, small-sd3, tiny-pixart-sigma):
plain diffusers loads and runs what they write, safetensors only, determinism, CLI and
bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The FLUX builder tests' CLI runner and file snapshot.
from test_flux_builder import _cli
from tree_files import tree_files

from diffserve.errors import ConfigError

SD3_WEIGHTS = {
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.safetensors",
    "text_encoder/model.safetensors",
    "text_encoder_2/model.safetensors",
    "text_encoder_3/model.safetensors",
}
PIXART_WEIGHTS = {
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.safetensors",
    "text_encoder/model.safetensors",
}


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffserve.zoo.generic import build_generic_model

    return build_generic_model(
        "tiny-sd3", tmp_path_factory.mktemp("generic") / "tiny-sd3", seed=0
    )


@pytest.fixture(scope="module")
def pixart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from diffserve.zoo.generic import build_generic_model

    return build_generic_model(
        "tiny-pixart-sigma", tmp_path_factory.mktemp("generic") / "tiny-pixart", seed=0
    )


def test_tiny_sd3_loads_and_generates_with_diffusers(sd3_dir: Path) -> None:
    import numpy as np
    import torch
    from diffusers import StableDiffusion3Pipeline

    index = json.loads((sd3_dir / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusion3Pipeline"
    assert index["text_encoder_3"] == ["transformers", "T5EncoderModel"]
    sched = json.loads((sd3_dir / "scheduler/scheduler_config.json").read_text())
    assert sched["_class_name"] == "FlowMatchEulerDiscreteScheduler"
    assert (sched["shift"], sched["use_dynamic_shifting"]) == (3.0, False)

    pipe = StableDiffusion3Pipeline.from_pretrained(sd3_dir)
    assert pipe.image_encoder is None and pipe.feature_extractor is None
    assert (pipe.vae_scale_factor, pipe.patch_size, pipe.tokenizer_max_length) == (
        8,
        2,
        77,
    )
    vae, tr = pipe.vae.config, pipe.transformer.config
    assert (vae.latent_channels, vae.scaling_factor, vae.shift_factor) == (
        16,
        1.5305,
        0.0609,
    )
    assert not vae.use_quant_conv and not vae.use_post_quant_conv
    # Three distinct text widths: CLIP hidden states concatenate (and pad) up to the T5
    # width, the two CLIP projections concatenate into the pooled vector.
    clip_l, clip_g, t5 = (
        pipe.text_encoder.config,
        pipe.text_encoder_2.config,
        pipe.text_encoder_3.config,
    )
    assert len({clip_l.hidden_size, clip_g.hidden_size, t5.d_model}) == 3
    assert (
        clip_l.hidden_size + clip_g.hidden_size <= t5.d_model == tr.joint_attention_dim
    )
    assert tr.pooled_projection_dim == clip_l.projection_dim + clip_g.projection_dim
    assert tr.caption_projection_dim == tr.num_attention_heads * tr.attention_head_dim

    out = pipe(
        "a photo of a cat",
        height=64,
        width=64,
        num_inference_steps=2,
        guidance_scale=7.0,
        max_sequence_length=32,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    assert out.images.shape == (1, 64, 64, 3)
    assert np.isfinite(out.images).all() and out.images.std() > 0
    # Sizes: a multiple of 16 (VAE 8 x patch 2), at most 96 patches (pos_embed_max_size)
    # = 1536 px.
    small = pipe(
        "a cat",
        height=16,
        width=32,
        num_inference_steps=1,
        max_sequence_length=8,
        output_type="np",
    )
    assert small.images.shape == (1, 16, 32, 3)
    with pytest.raises(ValueError, match="divisible by 16"):
        pipe(
            "a cat",
            height=24,
            width=16,
            num_inference_steps=1,
            max_sequence_length=8,
            output_type="np",
        )
    with pytest.raises(ValueError, match="pos_embed_max_size"):
        pipe(
            "a cat",
            height=1552,
            width=16,
            num_inference_steps=1,
            max_sequence_length=8,
            output_type="np",
        )


def test_tiny_pixart_sigma_loads_and_generates_with_diffusers(pixart_dir: Path) -> None:
    import numpy as np
    import torch
    from diffusers import PixArtSigmaPipeline

    index = json.loads((pixart_dir / "model_index.json").read_text())
    assert index["_class_name"] == "PixArtSigmaPipeline"
    assert set(index) == {
        "_class_name",
        "_diffusers_version",
        "scheduler",
        "text_encoder",
        "tokenizer",
        "transformer",
        "vae",
    }
    pipe = PixArtSigmaPipeline.from_pretrained(pixart_dir)
    assert type(pipe.scheduler).__name__ == "DPMSolverMultistepScheduler"
    sched = pipe.scheduler.config
    assert (
        sched.algorithm_type,
        sched.solver_order,
        sched.beta_schedule,
        sched.prediction_type,
    ) == ("dpmsolver++", 2, "linear", "epsilon")
    tr, vae = pipe.transformer.config, pipe.vae.config
    # Learned sigma.
    assert tr.out_channels == 2 * tr.in_channels == 2 * vae.latent_channels == 8
    assert (
        tr.caption_channels
        == pipe.text_encoder.config.d_model
        != tr.cross_attention_dim
    )
    assert (vae.scaling_factor, vae.shift_factor, pipe.vae_scale_factor) == (
        0.13025,
        None,
        8,
    )

    kwargs = {
        "num_inference_steps": 2,
        "clean_caption": False,
        "max_sequence_length": 32,
        "output_type": "np",
    }
    out = pipe(
        "a photo of a cat",
        height=64,
        width=64,
        use_resolution_binning=False,
        generator=torch.Generator().manual_seed(0),
        **kwargs,
    )
    assert out.images.shape == (1, 64, 64, 3)
    assert np.isfinite(out.images).all() and out.images.std() > 0
    # The default resolution binning (sample_size 32: the 256 px bins) renders a bin,
    # then resizes.
    binned = pipe("a red fox", height=64, width=96, **kwargs)
    assert binned.images.shape == (1, 64, 96, 3) and np.isfinite(binned.images).all()


@pytest.mark.parametrize(
    "fixture, weights", [("sd3_dir", SD3_WEIGHTS), ("pixart_dir", PIXART_WEIGHTS)]
)
def test_weights_are_safetensors_only(
    request: pytest.FixtureRequest, fixture: str, weights: set[str]
) -> None:
    root: Path = request.getfixturevalue(fixture)
    files = set(tree_files(root))
    assert {f for f in files if f.endswith(".safetensors")} == weights
    assert not [
        f for f in files if f.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    ]
    marker = json.loads((root / "diffserve_model.json").read_text())
    assert marker["random_weights"] is True and marker["seed"] == 0


def test_cli_builds_byte_identical_tiny_sd3(tmp_path: Path, sd3_dir: Path) -> None:
    # The fixture was built in this process, the CLI one in another (different hash
    # seed).
    out = tmp_path / "cli-sd3"
    proc = _cli("make-model", "tiny-sd3", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    built, fixture = tree_files(out), tree_files(sd3_dir)
    assert sorted(built) == sorted(fixture)
    assert [name for name in built if built[name] != fixture[name]] == []


def test_same_seed_identical_other_seed_changes_weights(
    tmp_path: Path, pixart_dir: Path
) -> None:
    import torch

    from diffserve.zoo.generic import build_generic_model

    base = tree_files(pixart_dir)
    torch.manual_seed(1234)
    rng_before = torch.random.get_rng_state()
    again = tree_files(
        build_generic_model("tiny-pixart-sigma", tmp_path / "again", seed=0)
    )
    assert torch.equal(rng_before, torch.random.get_rng_state())
    assert again == base
    other = tree_files(
        build_generic_model("tiny-pixart-sigma", tmp_path / "seed1", seed=1)
    )
    assert sorted(other) == sorted(base)
    assert {name for name in base if base[name] != other[name]} == {
        *PIXART_WEIGHTS,
        "diffserve_model.json",
    }


def test_guidance_embeds_with_a_generic_kind_is_a_clear_error(tmp_path: Path) -> None:
    proc = _cli("make-model", "tiny-pixart-sigma", tmp_path / "m", "--guidance-embeds")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("diffserve make-model: error: --guidance-embeds:")
    assert "FLUX kinds only" in lines[0] and "tiny-pixart-sigma" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_raise_config_error(tmp_path: Path, pixart_dir: Path) -> None:
    from diffserve.zoo.generic import build_generic_model

    with pytest.raises(ConfigError, match="unknown model 'huge-sd3'.*tiny-sd3"):
        build_generic_model("huge-sd3", tmp_path / "a")
    with pytest.raises(ConfigError, match="unknown model 'tiny-flux'"):
        # A FLUX kind has its own builder.
        build_generic_model("tiny-flux", tmp_path / "a")
    for seed in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="seed"):
            build_generic_model("tiny-sd3", tmp_path / "a", seed=seed)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not empty"):
        build_generic_model("tiny-pixart-sigma", pixart_dir)
    assert list(tmp_path.iterdir()) == []


def test_small_sd3_transformer_size() -> None:
    import torch
    from diffusers import SD3Transformer2DModel

    from diffserve.zoo.generic_specs import get_generic_spec

    spec = get_generic_spec("small-sd3")
    with torch.device("meta"):
        model = SD3Transformer2DModel(**spec.transformer)
    params = sum(p.numel() for p in model.parameters())
    assert 50e6 <= params <= 150e6, params
    assert spec.text_encoders == get_generic_spec("tiny-sd3").text_encoders


def test_modules_import_cheaply() -> None:
    code = (
        "import sys, diffserve.zoo.generic, diffserve.entrypoints.commands.make_model, "
        "diffserve.zoo.make_model;"
        "heavy = [m for m in ('torch', 'transformers', 'diffusers') "
        "if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
