"""``diffserve models inspect``: what a deployment would load, without loading it
(models/inspect.py): the files with sizes and sha256, a single file's layout, parameter
counts, bytes at the stage's dtype, and whether they fit a given device memory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from diffserve.entrypoints.cli import main
from diffserve.models.inspect import parse_size
from diffserve.zoo.flux_checkpoints import write_single_file


def _inspect(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict]:
    code = main(["models", "inspect", *args, "--json", "--platform", "cpu"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if out.strip() else {})


def _parameters(path: Path) -> int:
    return sum(t.numel() for t in load_file(str(path)).values())


def test_components_files_hashes_and_bytes(
    tiny_flux_dir: Path,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DIFFSERVE_CACHE_DIR", str(tmp_path / "cache"))
    code, doc = _inspect(capsys, str(tiny_flux_dir), "--dtype", "float32")
    assert code == 0 and doc["dtype"] == "float32"
    components = {c["name"]: c for c in doc["components"]}
    # No weights: tokenizers.
    assert set(components) == {"text_encoder", "text_encoder_2", "transformer", "vae"}
    transformer = components["transformer"]
    weights = tiny_flux_dir / "transformer" / "diffusion_pytorch_model.safetensors"
    assert transformer["files"] == [
        {
            "path": str(weights),
            "bytes": weights.stat().st_size,
            "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        }
    ]
    assert transformer["parameters"] == _parameters(weights) and transformer[
        "stored_dtypes"
    ] == {"F32": _parameters(weights)}
    assert transformer["device_bytes"] == 4 * transformer["parameters"]
    assert doc["device_bytes"] == sum(c["device_bytes"] for c in components.values())
    # Remembered: hashed once.
    assert len(list((tmp_path / "cache" / "hashes").glob("*.sha256"))) == 4

    _, half = _inspect(capsys, str(tiny_flux_dir), "--dtype", "bf16")
    assert half["device_bytes"] * 2 == doc["device_bytes"]
    code, fits = _inspect(
        capsys, str(tiny_flux_dir), "--dtype", "float32", "--device-memory", "1GiB"
    )
    assert code == 0 and fits["fits"] is True and fits["device_memory"] == 2**30
    code, tight = _inspect(
        capsys, str(tiny_flux_dir), "--dtype", "float32", "--device-memory", "1MiB"
    )
    assert code == 3 and tight["fits"] is False


def test_a_single_file_is_reported_with_its_layout(
    tiny_flux_dir: Path, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    bfl = write_single_file(tiny_flux_dir, tmp_path / "flux1-tiny.safetensors")
    comfy = write_single_file(
        tiny_flux_dir,
        tmp_path / "comfy.safetensors",
        layout="comfyui",
        bundled={"first_stage_model.extra": load_file(str(bfl))["img_in.bias"]},
    )
    folder = _parameters(
        tiny_flux_dir / "transformer" / "diffusion_pytorch_model.safetensors"
    )
    for path, layout in ((bfl, "bfl"), (comfy, "comfyui")):
        code, doc = _inspect(capsys, str(tiny_flux_dir), "--transformer", str(path))
        transformer = next(c for c in doc["components"] if c["name"] == "transformer")
        assert (
            code == 0
            and transformer["source"] == "single file"
            and transformer["layout"] == layout
        )
        # The bundled tensor is not the transformer's.
        assert transformer["parameters"] == folder


def test_broken_inputs_are_errors(
    tiny_flux_dir: Path, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    data = write_single_file(tiny_flux_dir, tmp_path / "whole.safetensors").read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[: len(data) // 2])
    code = main(
        ["models", "inspect", str(tiny_flux_dir), "--transformer", str(truncated)]
    )
    # A model file error (docs/api.md: exit status)
    assert code == 2 and "truncated" in capsys.readouterr().err
    code = main(["models", "inspect", str(tiny_flux_dir), "--device-memory", "lots"])
    assert code == 1 and "is not a size" in capsys.readouterr().err
    assert (
        parse_size("24GiB") == 24 * 2**30
        and parse_size("500MB") == 500 * 10**6
        and parse_size("1024") == 1024
    )


def test_quantized_bytes_match_what_the_pipeline_holds(
    tiny_flux_dir: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """``--quantization int8``: the transformer's Linear weights at a byte per value
    plus their scales, the family's ignored layers at the stage's dtype, within 2% of
    the loaded pipeline's own count."""
    pytest.importorskip("torchao")
    from diffserve.models.flux.pipeline import FluxPipeline

    monkeypatch.setenv("DIFFSERVE_CACHE_DIR", str(tmp_path))
    _, plain = _inspect(capsys, str(tiny_flux_dir), "--dtype", "float32")
    code, doc = _inspect(
        capsys, str(tiny_flux_dir), "--dtype", "float32", "--quantization", "int8"
    )
    assert code == 0
    by_name = {c["name"]: c for c in doc["components"]}
    transformer = by_name["transformer"]
    assert (
        transformer["quantization"] == "int8" and transformer["quantized_linears"] > 0
    )
    assert (
        by_name["vae"]["quantization"] == "none"
        and by_name["text_encoder"]["quantized_linears"] == 0
    )
    assert doc["device_bytes"] < plain["device_bytes"]
    loaded = FluxPipeline.from_pretrained(
        tiny_flux_dir, dtype="float32", quantization="int8"
    ).weights["transformer"]
    assert abs(transformer["device_bytes"] - loaded.bytes) <= 0.02 * loaded.bytes
