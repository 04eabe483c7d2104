"""Single-file transformer checkpoints (models/flux/checkpoint_layouts.py, ``components:
{transformer: FILE}``, ``--transformer FILE``): BFL's and ComfyUI's layouts give the
folder's weights bit for bit (test_text_encoder_files.py checks every component's
tensors and their alignment) and so the folder's image; an unknown layout, a truncated
file and a file of another model size are errors that name the file and what is wrong.

The files are written by diffserve.zoo.flux_checkpoints (diffusers names -> BFL names),
checked here against diffusers' own converter in the other direction, so the writer and
diffserve's reader are not one mapping."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from images import same_image
from safetensors.torch import load_file, save_file

from diffserve.config.resolve import resolve
from diffserve.errors import ConfigError, ModelLoadError
from diffserve.registry.models import MODEL_FAMILIES
from diffserve.zoo.flux_checkpoints import diffusers_to_bfl, write_single_file

REQUEST = dict(
    prompt="a fox", height=64, width=64, num_inference_steps=2, seed=3, output_type="pt"
)


def _diffusers_converter(hidden_size: int):
    """diffusers' ``convert_flux_transformer_checkpoint_to_diffusers``, which hard-codes
    FLUX.1's width (``inner_dim = 3072``), with the tiny model's width instead:
    otherwise its own code, unchanged."""
    from diffusers.loaders import single_file_utils

    source = inspect.getsource(
        single_file_utils.convert_flux_transformer_checkpoint_to_diffusers
    )
    assert source.count("inner_dim = 3072") == 1
    namespace = dict(vars(single_file_utils))
    exec(source.replace("inner_dim = 3072", f"inner_dim = {hidden_size}"), namespace)  # noqa: S102
    return namespace["convert_flux_transformer_checkpoint_to_diffusers"]


@pytest.mark.parametrize(
    "fixture", ["tiny_flux_dir", "tiny_flux_dev_dir"], ids=["schnell", "dev"]
)
def test_our_bfl_writer_is_the_inverse_of_diffusers_converter(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    model = request.getfixturevalue(fixture)
    original = load_file(
        str(model / "transformer" / "diffusion_pytorch_model.safetensors")
    )
    config = json.loads((model / "transformer" / "config.json").read_text())
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    back = _diffusers_converter(hidden)(dict(diffusers_to_bfl(original)))
    assert back.keys() == original.keys()
    assert all(torch.equal(back[k], original[k]) for k in original)


def _image(model: Path, **overrides) -> tuple[np.ndarray, dict]:
    from diffserve import Engine, GenerationRequest

    with Engine(str(model), dtype="float32", env={}, **overrides) as engine:
        out = engine.generate(GenerationRequest(**REQUEST))
    return out.images[0].numpy(), out.attestation


def test_bfl_and_comfyui_files_give_the_folders_image(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    bfl = write_single_file(tiny_flux_dir, tmp_path / "flux1-tiny.safetensors")
    comfy = write_single_file(
        tiny_flux_dir,
        tmp_path / "flux1-tiny-comfy.safetensors",
        layout="comfyui",
        bundled={
            "first_stage_model.decoder.conv_in.weight": torch.zeros(2, 2),
            "cond_stage_model.transformer.text_model.x": torch.zeros(1),
        },
    )
    folder, folder_attestation = _image(tiny_flux_dir)
    from diffserve.models.inspect import weights_fingerprint

    assert folder_attestation["weights_fingerprint"] == weights_fingerprint(
        tiny_flux_dir
    )
    for path in (bfl, comfy):
        config = resolve(
            model=str(tiny_flux_dir),
            overrides={"components": {"transformer": str(path)}},
            env={},
        )
        assert config.stages[0].components == {"transformer": str(path)}
        assert config.source_of("stages.0.components").layer == "cli"
        image, attestation = _image(
            tiny_flux_dir, components={"transformer": str(path)}
        )
        assert same_image(image, folder), path.name
        # Same pixels, other files: the weights fingerprint says which files were read.
        assert attestation["weights_fingerprint"] == weights_fingerprint(
            tiny_flux_dir, {"transformer": str(path)}
        )
        assert (
            attestation["weights_fingerprint"]
            != folder_attestation["weights_fingerprint"]
        )


def _error(tiny_flux_dir: Path, path: Path) -> str:
    from diffserve.models.flux.pipeline import FluxPipeline

    with pytest.raises(ModelLoadError) as err:
        FluxPipeline.from_pretrained(
            tiny_flux_dir, components={"transformer": str(path)}
        )
    return str(err.value)


def test_broken_and_foreign_files_are_errors_naming_the_file(
    tiny_flux_dir: Path, small_flux_dir: Path, tmp_path: Path
) -> None:
    weights = load_file(
        str(tiny_flux_dir / "transformer" / "diffusion_pytorch_model.safetensors")
    )
    sd3 = tmp_path / "sd3.safetensors"
    save_file(
        {
            "joint_blocks.0.x_block.attn.qkv.weight": torch.zeros(4, 4),
            "x_embedder.proj.weight": torch.zeros(2),
        },
        str(sd3),
    )
    assert "keys look like an SD3 MMDiT, expected a FLUX transformer" in _error(
        tiny_flux_dir, sd3
    )
    unet = tmp_path / "unet.safetensors"
    save_file(
        {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(2)}, str(unet)
    )
    assert "keys look like an SDXL / SD1.x UNet" in _error(tiny_flux_dir, unet)

    truncated = tmp_path / "truncated.safetensors"
    data = write_single_file(tiny_flux_dir, tmp_path / "whole.safetensors").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    assert f"{truncated}: not a readable safetensors file" in _error(
        tiny_flux_dir, truncated
    )

    # Another model size.
    bigger = write_single_file(small_flux_dir, tmp_path / "small.safetensors")
    text = _error(tiny_flux_dir, bigger)
    assert str(bigger) in text and ("wrong shape" in text or "do not match" in text), (
        text
    )

    missing = tmp_path / "missing.safetensors"
    bfl = diffusers_to_bfl(weights)
    dropped = sorted(bfl)[0]
    save_file({k: v.contiguous() for k, v in bfl.items() if k != dropped}, str(missing))
    text = _error(tiny_flux_dir, missing)
    assert str(missing) in text and "missing" in text, text

    with pytest.raises(ConfigError, match="no such file"):
        resolve(
            model=str(tiny_flux_dir),
            overrides={
                "components": {"transformer": str(tmp_path / "nope.safetensors")}
            },
            env={},
        )
    with pytest.raises(ConfigError, match="'tokenizer' cannot come from a single file"):
        resolve(
            model=str(tiny_flux_dir),
            overrides={"components": "tokenizer=x.safetensors"},
            env={},
        )


def test_generic_path_refuses_single_files(
    tiny_sd3_dir: Path, tiny_flux_dir: Path, tmp_path: Path
) -> None:
    path = write_single_file(tiny_flux_dir, tmp_path / "flux.safetensors")
    with pytest.raises(
        ConfigError,
        match=r"single-file components are read on the native path "
        r"only \(by FluxPipeline",
    ):
        resolve(
            model=str(tiny_sd3_dir),
            overrides={"components": {"transformer": str(path)}},
            env={},
        )


def test_a_family_takes_only_the_components_it_reads_from_files(
    tiny_wan_dir: Path, tiny_flux_dir: Path, tmp_path: Path
) -> None:
    """Wan reads no single file: a ``components:`` entry is refused at resolve (it used
    to be accepted, never read and still fingerprinted); FLUX's are accepted."""
    path = tmp_path / "flux1-tiny.safetensors"
    path.write_bytes(b"")  # resolve checks only that it exists
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(f"components:\n  transformer: {path}\n")
    with pytest.raises(ConfigError) as err:
        resolve(model=str(tiny_wan_dir), deploy_config=deploy, env={})
    assert (
        err.value.path == "stages.0.components.transformer"
        and err.value.source == f"{deploy.resolve()}:1"
    )
    assert (
        "WanPipeline does not read its transformer from a single "
        "file (it reads no component" in str(err.value)
    )
    assert "serve the transformer from the model's folder" in str(err.value)
    config = resolve(model=str(tiny_flux_dir), deploy_config=deploy, env={})
    assert config.stages[0].components == {"transformer": str(path)}


@pytest.mark.e2e
def test_generate_cli_reads_a_bfl_file(tiny_flux_dir: Path, tmp_path: Path) -> None:
    """``diffserve generate MODEL --transformer FILE`` in its own process, and a deploy
    file's ``components:`` in ``config explain`` with its line."""
    import programs

    bfl = write_single_file(tiny_flux_dir, tmp_path / "flux1-tiny.safetensors")
    out = tmp_path / "out.png"
    proc = programs.run(
        "diffserve.entrypoints.cli",
        "--log-level",
        "info",
        "generate",
        tiny_flux_dir,
        "a fox",
        "-o",
        out,
        "--size",
        "64x64",
        "--steps",
        "2",
        "--seed",
        "3",
        "--no-progress",
        "--transformer",
        bfl,
        timeout=180,
    )
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-2000:]
    assert f"loaded FLUX transformer from {bfl} (bfl layout" in proc.stderr
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(f"enforce_eager: true\ncomponents:\n  transformer: {bfl}\n")
    config = resolve(model=str(tiny_flux_dir), deploy_config=deploy, env={})
    assert config.stages[0].components == {"transformer": str(bfl)}
    assert config.source_of("stages.0.components").describe() == f"{deploy.resolve()}:2"


# -- the VAE: BFL's ae.safetensors (the latent-diffusion layout) and ComfyUI's
# first_stage_model. ---------


def test_our_vae_writer_is_the_inverse_of_diffusers_converter(
    tiny_flux_dir: Path,
) -> None:
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    from diffserve.zoo.vae_checkpoints import diffusers_vae_to_ldm

    original = load_file(
        str(tiny_flux_dir / "vae" / "diffusion_pytorch_model.safetensors")
    )
    config = json.loads((tiny_flux_dir / "vae" / "config.json").read_text())
    back = convert_ldm_vae_checkpoint(diffusers_vae_to_ldm(original), config)
    assert back.keys() == original.keys()
    assert all(torch.equal(back[k], original[k]) for k in original)


def test_ae_and_comfyui_vae_files_give_the_folders_image(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    from diffserve.zoo.vae_checkpoints import COMFYUI_VAE_PREFIX, write_vae_file

    ae = write_vae_file(tiny_flux_dir, tmp_path / "ae.safetensors")
    comfy = write_vae_file(
        tiny_flux_dir, tmp_path / "comfy-vae.safetensors", prefix=COMFYUI_VAE_PREFIX
    )
    transformer = write_single_file(tiny_flux_dir, tmp_path / "flux1-tiny.safetensors")
    folder, _ = _image(tiny_flux_dir)
    for components in (
        {"vae": str(ae)},
        {"vae": str(comfy)},
        {"vae": str(ae), "transformer": str(transformer)},
    ):
        image, _ = _image(tiny_flux_dir, components=components)
        assert same_image(image, folder), components
    # A transformer file given as the VAE is named for what it is.
    from diffserve.models.flux.pipeline import FluxPipeline

    with pytest.raises(
        ModelLoadError, match="keys look like a FLUX transformer, expected a VAE"
    ):
        FluxPipeline.from_pretrained(
            tiny_flux_dir, components={"vae": str(transformer)}
        )


# -- key mismatches: every component and layout names the keys as its file does, with
# their count. -------------

# component:layout -> (a key to delete, a key to shorten by a row), as the file names
# them.
_CLIP, _T5 = "text_encoders.clip_l.transformer.", "text_encoders.t5xxl.transformer."
KEY_CASES = {
    "transformer:diffusers": (
        "transformer_blocks.0.attn.to_k.weight",
        "proj_out.weight",
    ),
    "transformer:bfl": (
        "single_blocks.0.linear1.weight",
        "double_blocks.0.img_mlp.2.weight",
    ),  # native: 2 / .1
    "transformer:comfyui": (
        "model.diffusion_model.double_blocks.0.img_mlp.2.bias",
        "model.diffusion_model.final_layer.linear.weight",
    ),
    "vae:diffusers": (
        "decoder.mid_block.attentions.0.to_q.weight",
        "encoder.conv_in.bias",
    ),
    "vae:ldm": (
        "decoder.mid.attn_1.q.weight",
        "decoder.up.0.block.0.conv1.bias",
    ),  # converted to diffusers' names
    "vae:comfyui": (
        "first_stage_model.decoder.mid.attn_1.k.bias",
        "first_stage_model.encoder.conv_out.bias",
    ),
    "text_encoder:transformers": (
        "text_model.encoder.layers.0.mlp.fc1.weight",
        "text_model.final_layer_norm.weight",
    ),
    "text_encoder:comfyui": (
        f"{_CLIP}text_model.encoder.layers.1.self_attn.q_proj.bias",
        f"{_CLIP}text_model.encoder.layers.0.layer_norm1.weight",
    ),
    "text_encoder_2:transformers": (
        "encoder.block.0.layer.0.SelfAttention.q.weight",
        "encoder.final_layer_norm.weight",
    ),
    "text_encoder_2:comfyui": (
        f"{_T5}encoder.block.1.layer.1.layer_norm.weight",
        f"{_T5}shared.weight",
    ),
}


def _file_tensors(
    model: Path, component: str, layout: str
) -> tuple[dict[str, torch.Tensor], str]:
    """A single file of ``component`` in ``layout`` (its tensors) and the prefix its
    component's keys have."""
    from diffserve.zoo.comfyui_checkpoints import (
        COMFYUI_TEXT_ENCODER_PREFIXES,
        text_encoder_tensors,
    )
    from diffserve.zoo.vae_checkpoints import COMFYUI_VAE_PREFIX, diffusers_vae_to_ldm

    if component in ("transformer", "vae"):
        tensors = load_file(
            str(model / component / "diffusion_pytorch_model.safetensors")
        )
        if layout != "diffusers":
            tensors = (
                diffusers_to_bfl(tensors)
                if component == "transformer"
                else diffusers_vae_to_ldm(tensors)
            )
        prefix = {"transformer": "model.diffusion_model.", "vae": COMFYUI_VAE_PREFIX}[
            component
        ]
    else:
        tensors, prefix = (
            text_encoder_tensors(model, component),
            COMFYUI_TEXT_ENCODER_PREFIXES[component],
        )
    prefix = prefix if layout == "comfyui" else ""
    return {prefix + k: v.contiguous() for k, v in tensors.items()}, prefix


def _load_component(model: Path, component: str, path: Path) -> str:
    """The error of loading ``component`` from ``path`` with the loader the pipeline
    uses for it."""
    from transformers import CLIPTextModel, T5EncoderModel

    from diffserve.config.stage_sections import AttentionBackendConfig
    from diffserve.layers.kernels import build_kernel_set
    from diffserve.models.flux.transformer import load_flux_transformer
    from diffserve.models.text_encoder_file import load_text_encoder
    from diffserve.models.vae_file import load_vae

    with pytest.raises(ModelLoadError) as err:
        if component == "transformer":
            kernels = build_kernel_set(
                "torch",
                AttentionBackendConfig("sdpa"),
                device="cpu",
                dtype=torch.float32,
                roles=MODEL_FAMILIES["FluxPipeline"].attention_roles,
            )
            load_flux_transformer(
                model / "transformer", kernels, weights_file=str(path)
            )
        elif component == "vae":
            load_vae(
                model / "vae", dtype=torch.float32, device="cpu", weights_file=str(path)
            )
        else:
            cls = CLIPTextModel if component == "text_encoder" else T5EncoderModel
            load_text_encoder(
                cls, model / component, component, str(path), dtype=torch.float32
            )
    return str(err.value)


@pytest.mark.parametrize("case", list(KEY_CASES))
def test_a_missing_unexpected_or_misshapen_key_is_named_with_the_count(
    tiny_flux_dir: Path, tmp_path: Path, case: str
) -> None:
    component, layout = case.split(":")
    tensors, prefix = _file_tensors(tiny_flux_dir, component, layout)
    dropped, shortened = KEY_CASES[case]
    short_shape = (tensors[shortened].shape[0] - 1, *tensors[shortened].shape[1:])
    # CLIP files' own level, kept in the names:
    inner = "text_model." if component == "text_encoder" else ""
    extra = [f"{prefix}{inner}zz_extra.{i}.weight" for i in range(3)]
    edits = {
        f"missing 1 key: {dropped} (": lambda t: t.pop(dropped),
        f"unexpected 3 keys: {', '.join(extra)} (": lambda t: t.update(
            {k: torch.zeros(2) for k in extra}
        ),
        "wrong shape in 1 key: "
        f"{shortened} (found {short_shape}, "
        f"expected {tuple(tensors[shortened].shape)})": lambda t: t.update(
            {shortened: t[shortened][:-1].clone()}
        ),
    }
    for expected, edit in edits.items():
        broken = dict(tensors)
        edit(broken)
        path = tmp_path / f"{case.replace(':', '-')}.safetensors"
        save_file(broken, str(path))
        text = _load_component(tiny_flux_dir, component, path)
        assert text.startswith(f"{path}: weights do not match ") and expected in text, (
            case,
            text,
        )


def test_the_engine_error_names_the_missing_key(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    """What a user meets: the Engine's raised error (the CLI prints it, a server's
    /health carries it)."""
    from diffserve import Engine

    tensors, _ = _file_tensors(tiny_flux_dir, "transformer", "bfl")
    tensors.pop("double_blocks.0.img_attn.qkv.weight")
    path = tmp_path / "flux1-missing.safetensors"
    save_file(tensors, str(path))
    with (
        pytest.raises(ModelLoadError) as err,
        Engine(
            str(tiny_flux_dir),
            dtype="float32",
            env={},
            components={"transformer": str(path)},
        ),
    ):
        pass
    assert (
        f"{path}: weights do not match the transformer's config.json: missing 1 key: "
        "double_blocks.0.img_attn.qkv.weight (" in str(err.value)
    )
