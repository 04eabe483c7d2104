"""``POST /v1/images/edits`` end to end: the real ``diffserve serve`` process
(``uni_server`` in conftest: tiny FLUX, uni executor, API key, --default-steps 2),
called with the official ``openai`` client unmodified.

The bad-input tests are answered by the HTTP layer, before the engine. The success paths
need the engine's edit support (admission's image size and the FLUX img2img / inpainting
path)."""

from __future__ import annotations

import base64
import io
import json
import socket
import subprocess

import httpx
import openai
import programs
import pytest
from PIL import Image
from test_e2e_generate_cli import run_in_process

pytestmark = pytest.mark.e2e

MODEL = "tiny-flux"
EDITS = "/v1/images/edits"
EDIT = {"strength": 0.6, "seed": 1, "num_inference_steps": 4}


@pytest.fixture(scope="module")
def server(uni_server):
    return uni_server


def png(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def photo(width: int, height: int) -> Image.Image:
    image = Image.new("RGB", (width, height), (30, 90, 200))
    image.paste((240, 200, 40), (width // 4, height // 4, width // 2, height // 2))
    return image


def decode(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def error_of(exc: openai.APIStatusError) -> dict:
    return exc.body if "code" in (exc.body or {}) else exc.response.json()["error"]


# --- success paths (need the engine side of edits)
# ----------------------------------------------------
def test_edit_returns_the_input_size_with_seeds_and_attestation(client) -> None:
    source = png(photo(80, 64))
    result = client.images.edit(
        model=MODEL,
        image=("in.png", source, "image/png"),
        prompt="a fox",
        extra_body=EDIT,
    )
    meta = result.model_extra["diffserve"]
    image = decode(result.data[0].b64_json)
    assert result.size == "80x64" and image.size == (80, 64) and image.format == "PNG"
    assert (
        meta["seeds"] == [1]
        and meta["num_inference_steps"] == 4
        and meta["attestation"]
    )
    assert image.text["seed"] == "1" and image.text["strength"] == "0.6"
    again = client.images.edit(
        model=MODEL,
        image=("in.png", source, "image/png"),
        prompt="a fox",
        extra_body=EDIT,
    )
    # The seed reproduces it.
    assert decode(again.data[0].b64_json).tobytes() == image.tobytes()


def test_size_defaults_to_the_image_rounded_down_to_the_model_multiple(client) -> None:
    result = client.images.edit(
        image=("in.jpg", png(photo(70, 50), "JPEG"), "image/jpeg"),
        prompt="x",
        extra_body={"num_inference_steps": 2, "seed": 3},
    )
    assert result.size == "64x48" and decode(result.data[0].b64_json).size == (64, 48)
    result = client.images.edit(
        image=("in.png", png(photo(70, 50))),
        prompt="x",
        size="32x32",
        n=2,
        extra_body={"num_inference_steps": 2, "seed": 3},
    )
    assert result.model_extra["diffserve"]["seeds"] == [3, 4]
    assert [decode(d.b64_json).size for d in result.data] == [(32, 32), (32, 32)]


def test_edit_with_an_openai_mask(client, tiny_flux_dir) -> None:
    """The acceptance: OpenAI's mask (transparent = edit) gives diffusers'
    FluxInpaintPipeline's image for the equivalent mask (white where OpenAI's is
    transparent), same weights, input, seed and steps."""
    import numpy as np
    import torch
    from diffusers import FluxInpaintPipeline

    mask = Image.new("RGBA", (64, 64), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (16, 16, 48, 48))  # transparent: repaint here
    kwargs = {
        "image": ("in.png", png(photo(64, 64))),
        "prompt": "a fox",
        "extra_body": EDIT,
    }
    masked = client.images.edit(mask=("mask.png", png(mask), "image/png"), **kwargs)
    plain = client.images.edit(**kwargs)
    ours = decode(masked.data[0].b64_json)
    assert masked.size == "64x64" and ours.size == (64, 64)
    assert ours.tobytes() != decode(plain.data[0].b64_json).tobytes()
    white = Image.new("L", (64, 64), 0)
    white.paste(255, (16, 16, 48, 48))
    pipe = FluxInpaintPipeline.from_pretrained(
        str(tiny_flux_dir), torch_dtype=torch.float32
    )
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(
        prompt="a fox",
        image=photo(64, 64),
        mask_image=white,
        strength=0.6,
        height=64,
        width=64,
        num_inference_steps=4,
        generator=torch.Generator().manual_seed(1),
    ).images[0]
    mse = np.mean(
        (np.asarray(ours.convert("RGB"), np.float64) - np.asarray(theirs, np.float64))
        ** 2
    )
    assert mse == 0 or 10 * np.log10(255.0**2 / mse) >= 40


def test_edit_streams_progress_then_the_result(server) -> None:
    files = {"image": ("in.png", png(photo(64, 64)), "image/png")}
    data = {"prompt": "x", "stream": "true", "num_inference_steps": "2", "seed": "5"}
    with httpx.stream(
        "POST",
        server.url + EDITS,
        headers=server.auth,
        files=files,
        data=data,
        timeout=120,
    ) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith(
            "text/event-stream"
        )
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    kinds = [json.loads(e)["type"] for e in events[:-1]]
    assert kinds == ["progress", "progress", "result"] and events[-1] == "[DONE]"
    assert json.loads(events[-2])["diffserve"]["seeds"] == [5]


# --- bad input: refused by the HTTP layer, before the engine
# ----------------------------------------------
def png_header(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data))
        )

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"image": ("in.png", b"\x89PNG\r\n\x1a\n corrupt")}, "image"),
        ({"image": ("in.txt", b"hello, not an image", "text/plain")}, "image"),
        ({"image": ("in.gif", png(photo(32, 32), "GIF"), "image/gif")}, "image"),
        ({"image": ("bomb.png", png_header(60000, 60000))}, "image"),
        ({"image": ("wide.png", png_header(9000, 16))}, "image"),
        (
            {
                "image": ("in.png", png(photo(32, 32))),
                "mask": ("m.png", png(Image.new("LA", (32, 16)))),
            },
            "mask",
        ),
        (
            {"image": ("in.png", png(photo(32, 32))), "mask": ("m.png", b"garbage")},
            "mask",
        ),
        ({"image": [("in.png", png(photo(32, 32)))] * 5}, "image"),
        (
            {"image": ("in.png", png(photo(32, 32))), "extra_body": {"strength": 1.5}},
            "strength",
        ),
        (
            {"image": ("in.png", png(photo(32, 32))), "extra_body": {"seed": "one"}},
            "seed",
        ),
        ({"image": ("in.png", png(photo(32, 32))), "quality": "high"}, "quality"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_the_server_keeps_serving(
    server, client, kwargs: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.images.edit(prompt="x", **kwargs)
    assert error_of(info.value)["param"] == param
    assert httpx.get(server.url + "/ready").status_code == 200


def test_upload_over_the_limit_is_413_from_the_header(server) -> None:
    # server.max_upload_bytes is 20 MiB by default: declared larger, refused before a
    # byte is read.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            (
                f"POST {EDITS} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
                f"{server.auth['Authorization']}\r\n"
                "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: "
                f"{21 << 20}\r\n\r\n"
            ).encode()
        )
        answer = b""
        while b"body_too_large" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413") and b"body_too_large" in answer


def test_a_corrupt_upload_leaves_the_server_serving(server, client) -> None:
    with pytest.raises(openai.BadRequestError):
        client.images.edit(image=("in.png", b"\xff\xd8\xff corrupt jpeg"), prompt="x")
    # Wrong content type: the JSON endpoint's rule, mirrored.
    resp = httpx.post(server.url + EDITS, headers=server.auth, json={"prompt": "x"})
    assert resp.status_code == 415 and resp.json()["error"]["param"] == "Content-Type"
    result = client.images.generate(
        prompt="still here", size="64x64", extra_body={"num_inference_steps": 2}
    )
    assert decode(result.data[0].b64_json).size == (64, 64)
    assert "Traceback" not in server.log()


# --- diffserve generate --image/--mask/--strength
# -----------------------------------------------------------
def run_cli(*args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    return programs.run("diffserve.entrypoints.cli", *args, timeout=timeout)


def test_generate_cli_edits_with_a_grayscale_mask(
    tiny_flux_dir, tmp_path, capsys
) -> None:
    (tmp_path / "in.png").write_bytes(png(photo(70, 50)))
    mask = Image.new("L", (70, 50), 0)
    # No alpha channel: white = repaint (diffusers' convention)
    mask.paste(255, (10, 10, 40, 30))
    mask.save(tmp_path / "m.png")
    out = tmp_path / "out.png"
    proc = run_in_process(
        capsys,
        "generate",
        tiny_flux_dir,
        "a fox",
        "-o",
        out,
        "--image",
        tmp_path / "in.png",
        "--mask",
        tmp_path / "m.png",
        "--strength",
        0.6,
        "--seed",
        9,
        "--steps",
        2,
        "--enforce-eager",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    assert Image.open(out).size == (64, 48) and "seed 9" in proc.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--image", "{bad}"), "image"),
        (("--image", "{missing}"), "No such file"),
        (("--mask", "{good}"), "--mask needs --image"),
        (("--image", "{good}", "--strength", "1.5"), "strength"),
    ],
)
def test_generate_cli_bad_edit_arguments_fail_fast(
    args: tuple, needle: str, tmp_path
) -> None:
    (tmp_path / "bad.png").write_bytes(b"not a png")
    (tmp_path / "good.png").write_bytes(png(photo(32, 32)))
    paths = {
        "bad": tmp_path / "bad.png",
        "good": tmp_path / "good.png",
        "missing": tmp_path / "none.png",
    }
    proc = run_cli("generate", "a fox", *(a.format(**paths) for a in args), timeout=60)
    assert proc.returncode != 0 and needle in proc.stderr, proc.stderr
