"""The hermetic FLUX builder: CLI, diffusers compatibility, determinism, bad
arguments."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import programs
import pytest
from tree_files import tree_files

from diffserve.errors import ConfigError

WEIGHT_FILES = (
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.safetensors",
    "text_encoder/model.safetensors",
    "text_encoder_2/model.safetensors",
)


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return programs.run("diffserve.entrypoints.cli", *args, timeout=240)


@pytest.fixture(scope="module")
def cli_built_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "tiny"
    proc = _cli("make-model", "tiny-flux", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    return out


def test_cli_model_loads_and_generates_with_diffusers(cli_built_dir: Path) -> None:
    import numpy as np
    import torch
    from diffusers import FluxPipeline

    index = json.loads((cli_built_dir / "model_index.json").read_text())
    assert index["_class_name"] == "FluxPipeline"
    sched = json.loads((cli_built_dir / "scheduler/scheduler_config.json").read_text())
    assert sched["_class_name"] == "FlowMatchEulerDiscreteScheduler"
    assert (
        sched["use_dynamic_shifting"],
        sched["base_shift"],
        sched["max_shift"],
        sched["shift"],
    ) == (True, 0.5, 1.15, 3.0)
    assert (sched["base_image_seq_len"], sched["max_image_seq_len"]) == (256, 4096)

    pipe = FluxPipeline.from_pretrained(cli_built_dir)
    assert pipe.vae_scale_factor == 8
    assert pipe.transformer.config.guidance_embeds is False
    assert pipe.tokenizer.model_max_length == 77
    out = pipe(
        "a photo of a cat",
        height=128,
        width=128,
        num_inference_steps=2,
        guidance_scale=0.0,
        max_sequence_length=64,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    image = out.images
    assert image.shape == (1, 128, 128, 3)
    assert np.isfinite(image).all() and image.std() > 0

    with torch.no_grad():
        sample = pipe.transformer(
            hidden_states=torch.randn(1, 64, 64),
            encoder_hidden_states=torch.randn(1, 64, 64),
            pooled_projections=torch.randn(1, 32),
            timestep=torch.tensor([0.5]),
            img_ids=torch.zeros(64, 3),
            txt_ids=torch.zeros(64, 3),
        ).sample
    assert sample.shape == (1, 64, 64)
    assert torch.isfinite(sample).all()


def test_dev_model_has_guidance_embedding_and_generates(
    tiny_flux_dev_dir: Path,
) -> None:
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(tiny_flux_dev_dir)
    assert pipe.transformer.config.guidance_embeds is True
    out = pipe(
        "a red fox",
        height=128,
        width=128,
        num_inference_steps=2,
        guidance_scale=3.5,
        max_sequence_length=64,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
    )
    assert out.images.shape == (1, 3, 128, 128)
    assert torch.isfinite(out.images).all()


def test_tokenizers_cover_prompts(tiny_flux_dir: Path) -> None:
    from transformers import AutoTokenizer

    clip = AutoTokenizer.from_pretrained(tiny_flux_dir / "tokenizer")
    t5 = AutoTokenizer.from_pretrained(tiny_flux_dir / "tokenizer_2")
    prompt = "A Photo of an astronaut, riding a horse! 42 #art"
    ids = clip(prompt + " caf\u00e9 \U0001f431").input_ids
    assert ids[0] == clip.bos_token_id and ids[-1] == clip.eos_token_id
    # Byte-level BPE covers any text; CLIP's decode puts a space after every pre-token.
    decoded = clip.decode(ids, skip_special_tokens=True)
    assert decoded.replace(" ", "") == (
        prompt + " caf\u00e9 \U0001f431"
    ).lower().replace(" ", "")
    t5_ids = t5(prompt).input_ids
    assert t5.unk_token_id not in t5_ids and t5_ids[-1] == t5.eos_token_id
    assert t5.decode(t5_ids, skip_special_tokens=True) == prompt
    # Learned pieces, not just characters: a corpus word is one token.
    assert len(t5("photo", add_special_tokens=False).input_ids) == 1


def test_same_seed_is_byte_identical_across_processes(
    cli_built_dir: Path, tiny_flux_dir: Path
) -> None:
    # The fixture was built in this process, the CLI one in another (different hash
    # seed).
    built, fixture = tree_files(cli_built_dir), tree_files(tiny_flux_dir)
    assert sorted(built) == sorted(fixture)
    assert set(WEIGHT_FILES) <= set(built)
    differing = [name for name in built if built[name] != fixture[name]]
    assert not differing


def test_different_seed_changes_every_weight_file_only(
    tmp_path: Path, tiny_flux_dir: Path
) -> None:
    from diffserve.zoo.flux import build_flux_model

    other = tree_files(build_flux_model("tiny-flux", tmp_path / "seed1", seed=1))
    base = tree_files(tiny_flux_dir)
    differing = {name for name in base if base[name] != other[name]}
    assert differing == {*WEIGHT_FILES, "diffserve_model.json"}


def test_build_leaves_global_rng_untouched(tmp_path: Path) -> None:
    import torch

    from diffserve.zoo.flux import build_flux_model

    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    build_flux_model("tiny-flux", tmp_path / "m", seed=3)
    assert torch.equal(before, torch.random.get_rng_state())


def test_unknown_model_name_is_rejected(tmp_path: Path) -> None:
    target = tmp_path / "out"
    proc = _cli("make-model", "huge-flux", target)
    assert proc.returncode == 2
    assert "invalid choice: 'huge-flux'" in proc.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="unknown model 'huge-flux'.*tiny-flux"):
        from diffserve.zoo.flux import build_flux_model

        build_flux_model("huge-flux", target)
    assert list(tmp_path.iterdir()) == []


def test_non_empty_dir_without_force_is_rejected_and_untouched(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    proc = _cli("make-model", "tiny-flux", target)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert (
        lines[0].startswith("diffserve make-model: error:") and "not empty" in lines[0]
    )
    assert "--force" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert tree_files(target) == {"notes.txt": b"keep me"}
    # --force replaces models only, never arbitrary data.
    proc = _cli("make-model", "tiny-flux", target, "--force")
    assert proc.returncode == 1 and "refusing to delete" in proc.stderr
    assert tree_files(target) == {"notes.txt": b"keep me"}


def test_unwritable_dir_is_rejected_without_leftovers(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = _cli("make-model", "tiny-flux", blocker / "sub" / "model")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert (
        lines[0].startswith("diffserve make-model: error:")
        and "cannot write" in lines[0]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_failed_build_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffserve.zoo import flux as tiny

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tiny, "_write_pipeline", broken)
    with pytest.raises(OSError, match="No space left"):
        tiny.build_flux_model("tiny-flux", tmp_path / "new" / "deeper" / "model")
    assert list(tmp_path.iterdir()) == []


def test_force_replaces_a_previous_model(tmp_path: Path, tiny_flux_dir: Path) -> None:
    from diffserve.zoo.flux import build_flux_model

    target = tmp_path / "m"
    build_flux_model("tiny-flux", target, seed=5)
    with pytest.raises(ConfigError, match="not empty"):
        build_flux_model("tiny-flux", target, seed=0)
    build_flux_model("tiny-flux", target, seed=0, force=True)
    assert tree_files(target) == tree_files(tiny_flux_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert (target.stat().st_mode & 0o777) == (tiny_flux_dir.stat().st_mode & 0o777)


def test_small_flux_transformer_size() -> None:
    import torch
    from diffusers import FluxTransformer2DModel

    from diffserve.zoo.flux_specs import get_spec

    with torch.device("meta"):
        model = FluxTransformer2DModel(
            **get_spec("small-flux").transformer_config(guidance_embeds=False)
        )
    params = sum(p.numel() for p in model.parameters())
    assert 100e6 <= params <= 200e6, params


def test_cli_choices_match_specs() -> None:
    from diffserve.zoo.flux_specs import SPECS
    from diffserve.zoo.generic_specs import GENERIC_SPECS
    from diffserve.zoo.make_model import (
        FLUX_KINDS,
        GENERIC_KINDS,
        MODEL_KINDS,
        OWN_BUILDER_KINDS,
        WAN_KINDS,
        own_builder,
    )
    from diffserve.zoo.wan_specs import WAN_SPECS

    assert tuple(SPECS) == FLUX_KINDS
    assert tuple(GENERIC_SPECS) == GENERIC_KINDS
    assert tuple(WAN_SPECS) == WAN_KINDS
    own = tuple(OWN_BUILDER_KINDS)
    assert (*FLUX_KINDS, *GENERIC_KINDS, *WAN_KINDS, *own) == MODEL_KINDS
    # Each family's own builder resolves to a callable.
    for kind in OWN_BUILDER_KINDS:
        assert callable(own_builder(kind)), kind
