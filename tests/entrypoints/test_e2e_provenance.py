"""Provenance on real outputs: a PNG from the images API (the shared uni server, through
the ``openai`` client) and the files ``diffserve generate`` writes (PNG, MP4) pass
``diffserve verify``; identical requests stay byte-identical; provenance off writes no
manifest. Tampering is tests/provenance's (files built in-process)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from diffserve.entrypoints.cli import main
from diffserve.provenance.manifest import EMBED_KEY
from diffserve.provenance.verify import verify_bytes

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def verify_cli(*args: object) -> subprocess.CompletedProcess[str]:
    """``diffserve verify`` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "diffserve.entrypoints.cli", "verify", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_images_api_png_verifies_and_repeats_byte_for_byte(
    uni_server, client, tmp_path
) -> None:
    def generate():
        return client.images.generate(
            model=uni_server.model,
            prompt="a provenance fox",
            size="64x64",
            response_format="b64_json",
            extra_body={"num_inference_steps": 2, "seed": 11},
        )

    first, second = generate(), generate()
    assert first.data[0].b64_json == second.data[0].b64_json
    path = tmp_path / "fox.png"
    path.write_bytes(base64.b64decode(first.data[0].b64_json))
    # The server made its key in its state directory on first use.
    key = uni_server.log_path.parent / "state" / "diffserve" / "provenance-ed25519.pem"
    assert key.stat().st_mode & 0o777 == 0o600
    proc = verify_cli(path, "--key", key, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    generation = report["manifest"]["assertions"][1]["data"]
    info = first.model_extra["diffserve"]
    assert generation["model"] == uni_server.model
    assert generation["seed"] == info["seeds"][0] == 11
    assert generation["config_fingerprint"] == info["config_fingerprint"]
    assert generation["weights_fingerprint"] == info["attestation"].get(
        "weights_fingerprint", ""
    )
    assert generation["kernels"]["linear"] == sorted(info["attestation"]["linear"])


def generate_args(model_dir: Path, out: Path, *extra: object) -> list[str]:
    return [
        str(a)
        for a in (
            "generate",
            model_dir,
            "a red cube",
            "-o",
            out,
            "--seed",
            3,
            "--steps",
            1,
            "--enforce-eager",
            "--no-progress",
            *extra,
        )
    ]


def test_generate_png_verifies_and_provenance_off_has_none(
    tiny_flux_dir, tmp_path, capsys
) -> None:
    out = tmp_path / "cube.png"
    assert main(generate_args(tiny_flux_dir, out, "--size", "64x32")) == 0
    proc = verify_cli(out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "seed: 3" in proc.stdout and str(tiny_flux_dir) in proc.stdout
    # The same key as a server with this state directory would use.
    key = Path(os.environ["XDG_STATE_HOME"]) / "diffserve" / "provenance-ed25519.pem"
    assert verify_cli(out, "--key", key).returncode == 0

    off = tmp_path / "plain.png"
    args = generate_args(tiny_flux_dir, off, "--size", "64x32")
    assert main([*args, "--no-provenance-enabled"]) == 0
    assert EMBED_KEY not in Image.open(off).text
    proc = verify_cli(off)
    assert proc.returncode == 1 and "no provenance manifest" in proc.stdout
    # Same pixels: the manifest is metadata only.
    assert Image.open(off).tobytes() == Image.open(out).tobytes()


def test_generate_mp4_verifies(tiny_wan_dir, tmp_path, capsys) -> None:
    out = tmp_path / "clip.mp4"
    args = generate_args(
        tiny_wan_dir, out, "--size", "32x32", "--num-frames", 5, "--fps", 4
    )
    assert main([*args, "--dtype", "float32"]) == 0
    data = out.read_bytes()
    verdict = verify_bytes(data)
    assert verdict.valid, verdict.reason
    assert verdict.generation["output"]["frames"] == 5
    assert verdict.generation["seed"] == 3
    tampered = bytearray(data)
    # A byte in the middle of the media data ("mdat" comes before "moov" here).
    start = data.index(b"mdat") + 4
    tampered[start + (data.index(b"moov") - start) // 2] ^= 0x40
    assert not verify_bytes(bytes(tampered)).valid
