"""Strict, verified loading: what transformers and diffusers only warn about (a missing
weight they initialize randomly, an unexpected one) is an error naming the folder and
the keys; a tensor in two shards, an integer tensor where the model has floats, a
truncated file: errors too. A broken file stops ``generate`` with exit status 2 and a
one-line message, and a server reports it on /health and in every 503, without a
traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import programs
import pytest
import torch
from safetensors.torch import load_file, save_file

from diffserve.errors import ModelLoadError
from diffserve.models.flux.pipeline import FluxPipeline
from diffserve.models.loader import describe_key_mismatch, read_safetensors
from diffserve.zoo.flux_checkpoints import diffusers_to_bfl, write_single_file


def _copy(tiny_flux_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_flux_dir, tmp_path / "model"))


def _edit(path: Path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def test_one_wording_names_each_kind_of_mismatch_with_its_count() -> None:
    """models/loader.py's formatter, which every loader's key check goes through:
    sorted, the first five keys."""
    assert describe_key_mismatch() == ""
    assert (
        describe_key_mismatch(missing=["b.weight", "a.weight"])
        == "missing 2 keys: a.weight, b.weight"
    )
    assert (
        describe_key_mismatch(unexpected=[f"k{i}" for i in range(7)])
        == "unexpected 7 keys: k0, k1, k2, k3, k4, ... (2 more)"
    )
    assert (
        describe_key_mismatch(missing=["a"], wrong_shape=[("w", (3,), (4, 1))])
        == "missing 1 key: a; wrong shape in 1 key: w (found (3,), expected (4, 1))"
    )


def test_a_text_encoder_or_vae_that_transformers_or_diffusers_would_patch_is_refused(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    model = _copy(tiny_flux_dir, tmp_path)
    weights = model / "text_encoder_2" / "model.safetensors"
    dropped = sorted(load_file(str(weights)))[-1]
    _edit(weights, lambda t: t.pop(dropped))
    # T5's embedding is tied: its other name is missing too.
    with pytest.raises(
        ModelLoadError,
        match=r"text_encoder_2: weights do not match T5EncoderModel: "
        rf"missing \d keys?: (.*, )?{dropped} \(",
    ):
        FluxPipeline.from_pretrained(model)
    shutil.copy(tiny_flux_dir / "text_encoder_2" / "model.safetensors", weights)
    vae = model / "vae" / "diffusion_pytorch_model.safetensors"
    _edit(vae, lambda t: t.update({"decoder.leftover.weight": torch.zeros(2)}))
    with pytest.raises(
        ModelLoadError,
        match=r"vae: weights do not match AutoencoderKL: unexpected "
        r"1 key: decoder.leftover.weight \(",
    ):
        FluxPipeline.from_pretrained(model)


def test_a_wrong_shape_in_a_folder_names_the_key(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    model = _copy(tiny_flux_dir, tmp_path)
    for component, file in (
        ("text_encoder", "model.safetensors"),
        ("vae", "diffusion_pytorch_model.safetensors"),
    ):
        weights = model / component / file
        key = sorted(
            k
            for k in load_file(str(weights))
            if k.endswith("norm.weight") or "norm_out" in k
        )[0]
        _edit(weights, lambda t, key=key: t.update({key: t[key][:-1].clone()}))
        with pytest.raises(
            ModelLoadError,
            match=rf"{component}: weights do not match .*: wrong shape "
            rf"in 1 key: {key} \(found",
        ):
            FluxPipeline.from_pretrained(model)
        shutil.copy(tiny_flux_dir / component / file, weights)


@pytest.mark.parametrize("component", ["transformer", "text_encoder"])
def test_the_generic_path_loads_every_component_strictly(
    tiny_sd3_dir: Path, tmp_path: Path, component: str
) -> None:
    """diffusers' pipeline loader would initialize a missing tensor randomly and only
    warn."""
    from diffserve.config.resolve import resolve
    from diffserve.models.generic.pipeline import GenericPipeline

    model = Path(shutil.copytree(tiny_sd3_dir, tmp_path / "sd3"))
    weights = next((model / component).glob("*.safetensors"))
    dropped = sorted(load_file(str(weights)))[-1]
    _edit(weights, lambda t: t.pop(dropped))
    stage = resolve(model=str(model), env={}, overrides={"enforce_eager": True}).stages[
        0
    ]
    with pytest.raises(
        ModelLoadError,
        match=rf"{component}: weights do not match .*missing 1 key: {dropped}",
    ):
        GenericPipeline.from_stage(model, stage)


def test_a_tensor_in_two_shards_and_an_integer_weight_are_refused(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    tensors = load_file(
        str(tiny_flux_dir / "transformer" / "diffusion_pytorch_model.safetensors")
    )
    names = sorted(tensors)
    half = len(names) // 2
    # One key in both.
    save_file({k: tensors[k] for k in names[: half + 1]}, str(folder / "a.safetensors"))
    save_file({k: tensors[k] for k in names[half:]}, str(folder / "b.safetensors"))
    weight_map = {
        k: ("a.safetensors" if i <= half else "b.safetensors")
        for i, k in enumerate(names)
    }
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": weight_map})
    )
    with pytest.raises(
        ModelLoadError,
        match=r"b.safetensors: 1 tensors are also in an earlier shard "
        rf"\({names[half]}\)",
    ):
        read_safetensors(folder)

    bfl = {k: v.contiguous() for k, v in diffusers_to_bfl(tensors).items()}
    bfl["img_in.weight"] = bfl["img_in.weight"].to(torch.int8)
    path = tmp_path / "int8.safetensors"
    save_file(bfl, str(path))
    with pytest.raises(
        ModelLoadError,
        match=r"int8.safetensors: 1 tensors are stored as integers .* img_in.weight",
    ):
        FluxPipeline.from_pretrained(
            tiny_flux_dir, components={"transformer": str(path)}
        )


def _truncated(tiny_flux_dir: Path, tmp_path: Path) -> Path:
    data = write_single_file(tiny_flux_dir, tmp_path / "whole.safetensors").read_bytes()
    path = tmp_path / "flux1-truncated.safetensors"
    path.write_bytes(data[: len(data) // 3])
    return path


@pytest.mark.e2e
def test_generate_exits_2_with_one_line(tiny_flux_dir: Path, tmp_path: Path) -> None:
    broken = _truncated(tiny_flux_dir, tmp_path)
    proc = programs.run(
        "diffserve.entrypoints.cli",
        "generate",
        tiny_flux_dir,
        "a fox",
        "-o",
        tmp_path / "out.png",
        "--size",
        "64x64",
        "--steps",
        "1",
        "--no-progress",
        "--transformer",
        broken,
        timeout=180,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        f"{broken}: not a readable safetensors file" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    assert not (tmp_path / "out.png").exists()


@pytest.mark.e2e
def test_a_server_reports_the_broken_file_on_health_and_in_503s(
    tiny_flux_dir: Path, tmp_path: Path
) -> None:
    from server_process import ServerProcess

    broken = _truncated(tiny_flux_dir, tmp_path)
    server = ServerProcess(
        [str(tiny_flux_dir), "--enforce-eager", "--transformer", str(broken)],
        tmp_path / "server.log",
    )
    try:
        server.wait_for("/health", status=503)
        health = httpx.get(server.url + "/health", timeout=10).json()["error"]
        assert (
            "failed to load: ModelLoadError" in health["message"]
            and broken.name in health["message"]
        )
        response = httpx.post(
            server.url + "/v1/images/generations",
            json={"prompt": "a fox", "size": "64x64"},
            timeout=30,
        )
        assert (
            response.status_code == 503
            and broken.name in response.json()["error"]["message"]
        )
        assert httpx.get(server.url + "/ready", timeout=10).status_code == 503
    finally:
        server.stop()
    assert "Traceback" not in server.log()
