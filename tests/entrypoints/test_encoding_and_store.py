"""Image encoding (formats, PNG text metadata), the url image store, attestation ->
metrics."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

import pytest
from PIL import Image

from diffserve.entrypoints.openai.encoding import encode_all, encode_image
from diffserve.entrypoints.openai.image_store import ImageStore
from diffserve.entrypoints.openai.metrics import ServerMetrics, kernel_calls


def gradient(w: int = 32, h: int = 16) -> Image.Image:
    img = Image.new("RGB", (w, h))
    img.putdata(
        [(x * 8 % 256, y * 16 % 256, (x + y) % 256) for y in range(h) for x in range(w)]
    )
    return img


@pytest.mark.parametrize(
    ("fmt", "pil_format"), [("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")]
)
def test_formats_decode_at_size(fmt: str, pil_format: str) -> None:
    blob = encode_image(gradient(), fmt, compression=50)
    decoded = Image.open(io.BytesIO(blob))
    assert decoded.format == pil_format and decoded.size == (32, 16)


def test_png_is_lossless_and_carries_metadata() -> None:
    img = gradient()
    blobs = encode_all(
        [img, img],
        [7, 8],
        "png",
        None,
        {"prompt": "a fox", "steps": "2", "config_fingerprint": "abc"},
    )
    for blob, seed in zip(blobs, [7, 8], strict=True):
        decoded = Image.open(io.BytesIO(blob))
        assert decoded.text["seed"] == str(seed)
        assert (
            decoded.text["prompt"],
            decoded.text["steps"],
            decoded.text["config_fingerprint"],
        ) == ("a fox", "2", "abc")
        assert list(decoded.convert("RGB").getdata()) == list(img.getdata())


def test_store_expires_and_evicts() -> None:
    store = ImageStore(ttl_s=0.05, max_bytes=10)
    a = store.put(b"123456", "image/png", "png")
    assert a.endswith(".png") and store.get(a).data == b"123456"
    b = store.put(b"abcdef", "image/png", "png")  # over budget: the oldest goes
    assert store.get(a) is None and store.get(b) is not None
    time.sleep(0.06)
    assert store.get(b) is None and len(store) == 0
    assert store.get("nope.png") is None


def test_kernel_calls_from_attestation() -> None:
    att = {
        "worker_pid": 1,
        "counters": {
            "linear": {"torch": 29},
            "attention": {"sdpa": 4, "math": 0},
            "transformer_forwards": 2,
        },
    }
    assert sorted(kernel_calls(att)) == [
        ("attention", "sdpa", 4),
        ("linear", "torch", 29),
    ]
    assert kernel_calls({"linear": {"torch": 3}}) == [("linear", "torch", 3)]
    assert kernel_calls({}) == []


def test_metrics_observe_output_and_batches() -> None:
    m = ServerMetrics()
    m.observe_output({"denoise": 20.0, "total": 30.0}, 2)
    m.observe_batch(
        SimpleNamespace(outcome="ok", batch_size=2, kernels={"linear": {"torch": 5}})
    )
    text = m.render().decode()
    assert 'diffserve_kernel_calls_total{backend="torch",kind="linear"} 5.0' in text
    assert "diffserve_images_generated_total 2.0" in text
    assert 'diffserve_request_phase_seconds_count{phase="denoise"} 1.0' in text
    assert (
        "diffserve_batch_size_count 1.0" in text
        and "diffserve_batch_size_sum 2.0" in text
    )
    assert 'diffserve_batches_total{outcome="ok"} 1.0' in text
