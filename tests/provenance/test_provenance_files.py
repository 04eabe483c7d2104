"""Signed manifests built in-process (no model): every format verifies as written,
is byte-identical for identical inputs, and fails on a changed pixel, a changed field,
a removed manifest, another key, or a changed video packet."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from diffserve.config.server_schema import ServerConfig
from diffserve.entrypoints.openai.encoding import encode_all
from diffserve.entrypoints.provenance_keys import key_path, signer_for, state_root
from diffserve.provenance import manifest as m
from diffserve.provenance.facts import Generation, kernels_of
from diffserve.provenance.keys import Signing, load_signer
from diffserve.provenance.verify import verify_bytes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def signing(tmp_path_factory) -> Signing:
    key = tmp_path_factory.mktemp("key") / "signing.pem"
    generation = Generation(
        model="tiny",
        config_fingerprint="cf0123",
        seed=0,
        prompt="a red cube",
        weights_fingerprint="wf4567",
        revised_prompt="a shiny red cube on a table",
        steps=2,
        kernels={"linear": ["torch"], "attention": ["sdpa"]},
    )
    return Signing(load_signer(key, create=True), generation, "0.1.0")


def image() -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 255, (24, 40, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def encode(signing: Signing, fmt: str = "png", seed: int = 7) -> bytes:
    return encode_all([image()], [seed], fmt, None, {"prompt": "x"}, signing)[0]


def manifest_of(png: bytes) -> dict:
    return json.loads(Image.open(io.BytesIO(png)).text[m.EMBED_KEY])


def resave_png(png: bytes, text: str, change_pixel: bool = False) -> bytes:
    with Image.open(io.BytesIO(png)) as source:
        copy = source.copy()
    if change_pixel:
        r, g, b = copy.getpixel((3, 5))
        copy.putpixel((3, 5), ((r + 1) % 256, g, b))
    info = PngInfo()
    info.add_itxt(m.EMBED_KEY, text)
    out = io.BytesIO()
    copy.save(out, format="PNG", pnginfo=info)
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["png", "jpeg", "webp"])
def test_every_image_format_verifies_and_is_deterministic(signing, fmt) -> None:
    first, second = encode(signing, fmt), encode(signing, fmt)
    assert first == second  # no clock, no request id: Ed25519 is deterministic
    verdict = verify_bytes(first)
    assert verdict.valid, verdict.reason
    assert verdict.file_format == fmt
    facts = verdict.generation
    assert (facts["seed"], facts["model"], facts["config_fingerprint"]) == (
        7,
        "tiny",
        "cf0123",
    )
    assert facts["revised_prompt"] == "a shiny red cube on a table"
    assert "a red cube" not in json.dumps(verdict.manifest)  # only its hash
    assert verdict.public_key == signing.signer.public_key_b64
    # The manifest's own bytes are not part of the pixels it binds.
    decoded = np.asarray(Image.open(io.BytesIO(first)))
    plain = encode_all([image()], [7], fmt, None, {"prompt": "x"})[0]
    assert np.array_equal(decoded, np.asarray(Image.open(io.BytesIO(plain))))


def test_manifest_is_c2pa_shaped(signing) -> None:
    manifest = manifest_of(encode(signing))
    assert manifest["claim_generator"] == "diffserve/0.1.0"
    actions = m.assertion(manifest, "c2pa.actions")["actions"]
    assert actions == [
        {
            "action": "c2pa.created",
            "digitalSourceType": m.TRAINED_ALGORITHMIC,
            "softwareAgent": "diffserve/0.1.0",
        }
    ]
    assert m.assertion(manifest, m.PIXELS_LABEL)["alg"] == "sha256"
    assert manifest["signature"]["alg"] == "Ed25519"


def test_a_changed_pixel_fails(signing) -> None:
    png = encode(signing)
    text = Image.open(io.BytesIO(png)).text[m.EMBED_KEY]
    assert verify_bytes(resave_png(png, text)).valid  # re-saved alone: still ours
    verdict = verify_bytes(resave_png(png, text, change_pixel=True))
    assert not verdict.valid and verdict.reason.startswith("content hash mismatch")


def test_a_changed_field_fails(signing) -> None:
    png = encode(signing)
    manifest = manifest_of(png)
    m.assertion(manifest, m.GENERATION_LABEL)["seed"] = 8
    verdict = verify_bytes(resave_png(png, m.canonical(manifest).decode()))
    assert not verdict.valid and verdict.reason.startswith("signature mismatch")


def test_a_removed_manifest_and_another_key_fail(signing, tmp_path) -> None:
    png = encode(signing)
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).save(out, format="PNG")
    verdict = verify_bytes(out.getvalue())
    assert not verdict.valid and verdict.reason == "no provenance manifest in the file"
    other = load_signer(tmp_path / "other.pem", create=True)
    verdict = verify_bytes(png, trusted_key=other.public_key)
    assert not verdict.valid and verdict.reason.startswith("untrusted key")
    assert verify_bytes(png, trusted_key=signing.signer.public_key).valid


def test_an_mp4_verifies_and_a_changed_packet_fails(signing) -> None:
    from diffserve.entrypoints.jobs.media import write_mp4
    from diffserve.entrypoints.video_encoding import read_mp4

    frames = np.random.default_rng(1).integers(0, 255, (5, 32, 48, 3), dtype=np.uint8)
    audio = np.sin(np.linspace(0, 200, 8000, dtype=np.float32))[None]
    path = Path(os.environ["XDG_STATE_HOME"]).parent / "provenance-test.mp4"
    write_mp4(path, frames, 8, {"seed": "7"}, audio, 8000, signing.for_seed(7))
    data = path.read_bytes()
    verdict = verify_bytes(data)
    assert verdict.valid, verdict.reason
    assert verdict.generation["output"] == {
        "kind": "video",
        "format": "mp4",
        "width": 48,
        "height": 32,
        "frames": 5,
        "fps": 8,
        "audio": True,
    }
    decoded, tags, fps = read_mp4(data)  # still an ordinary MP4 with its tags
    assert decoded.shape == (5, 32, 48, 3) and tags["seed"] == "7" and fps == 8
    # One byte of the largest (video) packet flipped, the manifest left as it was.
    import av

    with av.open(io.BytesIO(data)) as container:
        largest = max(container.demux(), key=lambda p: p.size)
        offset = largest.pos + largest.size // 2
    tampered = bytearray(data)
    tampered[offset] ^= 0x01
    verdict = verify_bytes(bytes(tampered))
    assert not verdict.valid and verdict.reason.startswith("content hash mismatch")


def test_the_cli_exit_codes(signing, tmp_path) -> None:
    png = encode(signing)
    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    good.write_bytes(png)
    text = Image.open(io.BytesIO(png)).text[m.EMBED_KEY]
    bad.write_bytes(resave_png(png, text, change_pixel=True))
    (tmp_path / "notes.txt").write_text("hello")

    def verify(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "diffserve.entrypoints.cli", "verify", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )

    ok = verify(str(good), "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["valid"] and report["manifest"]["assertions"][1]["data"]["seed"] == 7
    failed = verify(str(bad))
    assert failed.returncode == 1 and "content hash mismatch" in failed.stdout
    assert verify(str(tmp_path / "notes.txt")).returncode == 2
    assert verify(str(tmp_path / "missing.png")).returncode == 2


def test_summary_names_model_seed_and_kernels(signing, tmp_path, capsys) -> None:
    from diffserve.entrypoints.cli import main

    path = tmp_path / "a.webp"
    path.write_bytes(encode(signing, "webp"))
    public = tmp_path / "public.pem"
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = Ed25519PublicKey.from_public_bytes(signing.signer.public_key)
    public.write_bytes(
        key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    assert main(["verify", str(path), "--key", str(public)]) == 0
    out = capsys.readouterr().out
    assert ": valid (webp" in out and "model: tiny" in out and "seed: 7" in out
    assert "kernels: attention=sdpa, linear=torch" in out


def test_the_default_key_is_made_once_private_and_shared(tmp_path) -> None:
    server = ServerConfig(state_dir=str(tmp_path / "state"))
    path, create = key_path(server)
    assert create and path == state_root(server) / "provenance-ed25519.pem"
    from diffserve.entrypoints.jobs.setup import state_root as jobs_state_root

    assert state_root(server) == jobs_state_root(server)
    # Racing creators agree on one key.
    with ThreadPoolExecutor(8) as pool:
        keys = list(
            pool.map(lambda _: load_signer(path, create=True).public_key_b64, range(16))
        )
    assert len(set(keys)) == 1
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporaries
    assert signer_for(server).public_key_b64 == keys[0]


def test_provenance_off_and_a_missing_key_file(tmp_path) -> None:
    from diffserve.config.manifest_schema import ProvenanceConfig
    from diffserve.errors import ConfigError

    off = ServerConfig(provenance=ProvenanceConfig(enabled=False))
    assert signer_for(off) is None
    png = encode_all([image()], [7], "png", None, {"prompt": "x"})[0]
    assert m.EMBED_KEY not in Image.open(io.BytesIO(png)).text
    missing = ServerConfig(
        provenance=ProvenanceConfig(key_file=str(tmp_path / "nope.pem"))
    )
    with pytest.raises(ConfigError, match="cannot read the provenance key"):
        signer_for(missing)


def test_kernels_are_backend_names_not_counts() -> None:
    # Counts vary with batching and caching; identical requests must sign alike.
    attestation = {"linear": {"torch": 120, "int8": 0}, "attention": {"sdpa": 8}}
    assert kernels_of(attestation) == {"linear": ["torch"], "attention": ["sdpa"]}


def test_signature_covers_everything_but_itself(signing) -> None:
    manifest = manifest_of(encode(signing))
    raw = base64.b64decode(manifest["signature"]["value"])
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    Ed25519PublicKey.from_public_bytes(signing.signer.public_key).verify(
        raw, m.signed_bytes(manifest)
    )
