"""Text encoders from single files (models/text_encoder_file.py, ``components:
{text_encoder: FILE, text_encoder_2: FILE}``, ``--text-encoder`` / ``--text-encoder-2``)
and ComfyUI's all-in-one checkpoints: one file named for all four components loads the
folder's weights bit for bit, in the same (64-byte aligned) memory layout, and so gives
the folder's image; a wrong, partial or scaled-fp8 file is an error naming the file and
what is wrong."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from images import same_image
from safetensors.torch import save_file

from diffserve.config.resolve import resolve
from diffserve.entrypoints.cli import main
from diffserve.errors import ModelLoadError
from diffserve.zoo.comfyui_checkpoints import (
    text_encoder_tensors,
    write_comfyui_bundle,
    write_text_encoder_file,
)

REQUEST = dict(
    prompt="a fox", height=64, width=64, num_inference_steps=2, seed=3, output_type="pt"
)
ALL_COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2")


def _image(model: Path, **overrides) -> tuple[np.ndarray, dict]:
    from diffserve import Engine, GenerationRequest

    with Engine(str(model), dtype="float32", env={}, **overrides) as engine:
        out = engine.generate(GenerationRequest(**REQUEST))
    return out.images[0].numpy(), out.attestation


def test_standalone_files_and_an_all_in_one_checkpoint_give_the_folders_image(
    tiny_flux_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clip = write_text_encoder_file(
        tiny_flux_dir, "text_encoder", tmp_path / "clip_l.safetensors"
    )
    t5 = write_text_encoder_file(
        tiny_flux_dir, "text_encoder_2", tmp_path / "t5xxl_fp16.safetensors"
    )
    bundle = write_comfyui_bundle(
        tiny_flux_dir, tmp_path / "flux1-tiny-aio.safetensors"
    )
    folder, folder_attestation = _image(tiny_flux_dir)
    whole = {name: str(bundle) for name in ALL_COMPONENTS}
    for components in ({"text_encoder": str(clip), "text_encoder_2": str(t5)}, whole):
        image, attestation = _image(tiny_flux_dir, components=components)
        # The file's tensors are the folder's, loaded into the same modules: the same
        # forward.
        assert same_image(image, folder), components
        assert (
            attestation["weights_fingerprint"]
            != folder_attestation["weights_fingerprint"]
        )
    # The transformer alone from the bundle: the log says what else the file holds and
    # how to use it.
    with caplog.at_level(logging.INFO, logger="diffserve"):
        image, _ = _image(tiny_flux_dir, components={"transformer": str(bundle)})
    assert same_image(image, folder)
    assert "also holds vae, text_encoder, text_encoder_2" in caplog.text
    assert "--text-encoder-2 FILE" in caplog.text


def test_every_file_gives_the_folders_weights_bit_for_bit_in_aligned_memory(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    """What the image tests rest on: each component read from a single file holds the
    folder's tensors exactly, and every weight starts on a 64-byte boundary whatever its
    offset in the file (models/loader.py, WEIGHT_ALIGNMENT), so a GEMM sees the same
    operands in the same layout."""
    from diffserve.models.flux.pipeline import FluxPipeline
    from diffserve.models.loader import WEIGHT_ALIGNMENT
    from diffserve.zoo.flux_checkpoints import write_single_file
    from diffserve.zoo.vae_checkpoints import write_vae_file

    files = {
        "transformer": write_single_file(
            tiny_flux_dir, tmp_path / "flux1-tiny.safetensors"
        ),
        "vae": write_vae_file(tiny_flux_dir, tmp_path / "ae.safetensors"),
        "text_encoder": write_text_encoder_file(
            tiny_flux_dir, "text_encoder", tmp_path / "clip_l.safetensors"
        ),
        "text_encoder_2": write_text_encoder_file(
            tiny_flux_dir, "text_encoder_2", tmp_path / "t5.safetensors"
        ),
    }
    bundle = write_comfyui_bundle(
        tiny_flux_dir, tmp_path / "flux1-tiny-aio.safetensors"
    )

    def weights(**components: str) -> dict[str, dict[str, torch.Tensor]]:
        pipeline = FluxPipeline.from_pretrained(tiny_flux_dir, components=components)
        modules = {
            "transformer": pipeline.transformer,
            "vae": pipeline.vae,
            **pipeline.encoders.modules(),
        }
        return {
            name: {**dict(module.named_parameters()), **dict(module.named_buffers())}
            for name, module in modules.items()
        }

    folder = weights()
    for components in (
        {k: str(v) for k, v in files.items()},
        {k: str(bundle) for k in ALL_COMPONENTS},
    ):
        loaded = weights(**components)
        for name, tensors in loaded.items():
            assert tensors.keys() == folder[name].keys(), name
            unequal = [
                k for k, t in tensors.items() if not torch.equal(t, folder[name][k])
            ]
            assert not unequal, (name, unequal[:5])
            for origin in (tensors, folder[name]):
                misaligned = [
                    k for k, t in origin.items() if t.data_ptr() % WEIGHT_ALIGNMENT
                ]
                assert not misaligned, (name, misaligned[:5])


def test_flags_reach_the_config_and_inspect_reports_each_layout(
    tiny_flux_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    clip = write_text_encoder_file(
        tiny_flux_dir, "text_encoder", tmp_path / "clip_l.safetensors"
    )
    bundle = write_comfyui_bundle(tiny_flux_dir, tmp_path / "aio.safetensors")
    code = main(
        [
            "models",
            "inspect",
            str(tiny_flux_dir),
            "--platform",
            "cpu",
            "--json",
            "--text-encoder",
            str(clip),
            "--text-encoder-2",
            str(bundle),
            "--vae",
            str(bundle),
            "--transformer",
            str(bundle),
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    reports = {c["name"]: c for c in doc["components"]}
    assert {name: (c["source"], c["layout"]) for name, c in reports.items()} == {
        "text_encoder": ("single file", "transformers"),
        "text_encoder_2": ("single file", "comfyui"),
        "vae": ("single file", "comfyui"),
        "transformer": ("single file", "comfyui"),
    }
    # Each component of the bundle counts only its own tensors: T5's as the folder's,
    # less the tied copy.
    t5_folder = text_encoder_tensors(tiny_flux_dir, "text_encoder_2")
    assert reports["text_encoder_2"]["parameters"] == sum(
        t.numel() for t in t5_folder.values()
    )

    config = resolve(
        model=str(tiny_flux_dir),
        env={},
        overrides={"components": f"text_encoder={clip}"},
    )
    assert dict(config.stages[0].components) == {"text_encoder": str(clip)}
    assert config.source_of("stages.0.components").layer == "cli"


def _load_error(tiny_flux_dir: Path, component: str, path: Path) -> str:
    from diffserve.models.flux.pipeline import FluxPipeline

    with pytest.raises(ModelLoadError) as err:
        FluxPipeline.from_pretrained(tiny_flux_dir, components={component: str(path)})
    return str(err.value)


def test_wrong_partial_and_scaled_files_are_errors_naming_the_file(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    t5 = write_text_encoder_file(
        tiny_flux_dir, "text_encoder_2", tmp_path / "t5.safetensors"
    )
    text = _load_error(tiny_flux_dir, "text_encoder", t5)
    assert (
        f"{t5}: keys look like a text encoder, expected the CLIP-L text encoder" in text
    ), text

    tensors = text_encoder_tensors(tiny_flux_dir, "text_encoder_2")
    dropped = sorted(k for k in tensors if k.startswith("encoder.block.0."))[0]
    partial = tmp_path / "t5-partial.safetensors"
    save_file(
        {k: v.contiguous() for k, v in tensors.items() if k != dropped}, str(partial)
    )
    text = _load_error(tiny_flux_dir, "text_encoder_2", partial)
    assert str(partial) in text and "missing" in text and dropped in text, text

    clip = text_encoder_tensors(tiny_flux_dir, "text_encoder")
    clip["text_model.final_layer_norm.weight"] = clip[
        "text_model.final_layer_norm.weight"
    ][:-1]
    other_size = tmp_path / "clip-other-size.safetensors"
    save_file({k: v.contiguous() for k, v in clip.items()}, str(other_size))
    text = _load_error(tiny_flux_dir, "text_encoder", other_size)
    assert str(other_size) in text and "final_layer_norm" in text, text

    scaled = tmp_path / "t5xxl_fp8_e4m3fn_scaled.safetensors"
    save_file(
        {
            **{k: v.contiguous() for k, v in tensors.items()},
            "scaled_fp8": torch.zeros(0),
        },
        str(scaled),
    )
    assert "a scaled-fp8 checkpoint" in _load_error(
        tiny_flux_dir, "text_encoder_2", scaled
    )
