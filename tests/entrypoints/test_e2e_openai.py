"""End to end: the real ``diffserve serve`` process (``uni_server`` in conftest: tiny
FLUX, uni executor, API key, max_queue=1, max_n=3), called with the official ``openai``
client."""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
from PIL import Image

pytestmark = pytest.mark.e2e

MODEL = "tiny-flux"
FAST = {"num_inference_steps": 2}


@pytest.fixture(scope="module")
def server(uni_server):
    return uni_server


def decode(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def pixels(img: Image.Image) -> bytes:
    return img.convert("RGB").tobytes()


def info(result) -> dict:
    return result.model_extra["diffserve"]


def test_models_and_probes(server, client) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    for path in ("/health", "/ready"):
        assert httpx.get(server.url + path).status_code == 200


def test_generate_without_extra_body(client) -> None:
    result = client.images.generate(model=MODEL, prompt="a red fox", size="64x64")
    assert result.output_format == "png" and result.size == "64x64"
    assert (
        len(result.data) == 1
        and result.data[0].revised_prompt is None
        and result.data[0].url is None
    )
    img = decode(result.data[0].b64_json)
    assert img.format == "PNG" and img.size == (64, 64)
    meta = info(result)
    # No seed sent: the server chose one and reports it; steps are the server's
    # --default-steps.
    assert len(meta["seeds"]) == 1 and meta["num_inference_steps"] == 2
    assert (
        img.text["seed"] == str(meta["seeds"][0]) and img.text["prompt"] == "a red fox"
    )
    assert img.text["config_fingerprint"] == meta["config_fingerprint"]
    assert img.text["steps"] == str(meta["num_inference_steps"])
    assert {"queue", "total", "image_encode"} <= set(meta["timings_ms"])


def test_n2_seeds_reproduce_each_image(client) -> None:
    result = client.images.generate(
        model=MODEL,
        prompt="a fox",
        size="128x64",
        n=2,
        extra_body={**FAST, "seed": 1234, "guidance_scale": 0.0},
    )
    seeds = info(result)["seeds"]
    assert seeds == [1234, 1235]
    images = [decode(d.b64_json) for d in result.data]
    assert [im.size for im in images] == [(128, 64), (128, 64)]
    assert pixels(images[0]) != pixels(images[1])
    # Image i alone, from its reported seed, is the same image.
    again = client.images.generate(
        model=MODEL,
        prompt="a fox",
        size="128x64",
        extra_body={**FAST, "seed": seeds[1], "guidance_scale": 0.0},
    )
    assert pixels(decode(again.data[0].b64_json)) == pixels(images[1])


def test_max_sequence_length_reaches_the_pipeline(client) -> None:
    body = {**FAST, "seed": 7, "guidance_scale": 0.0}
    short = client.images.generate(
        prompt="a fox", size="64x64", extra_body={**body, "max_sequence_length": 16}
    )
    again = client.images.generate(
        prompt="a fox", size="64x64", extra_body={**body, "max_sequence_length": 16}
    )
    full = client.images.generate(prompt="a fox", size="64x64", extra_body=body)
    assert decode(short.data[0].b64_json).size == (64, 64)
    assert pixels(decode(short.data[0].b64_json)) == pixels(
        decode(again.data[0].b64_json)
    )
    # A 16-token text window is a different transformer input than the default 512
    # tokens.
    assert pixels(decode(short.data[0].b64_json)) != pixels(
        decode(full.data[0].b64_json)
    )


def test_unseeded_request_is_reproducible(client) -> None:
    first = client.images.generate(prompt="a cat", size="64x64", extra_body=FAST)
    (seed,) = info(first)["seeds"]
    second = client.images.generate(
        prompt="a cat", size="64x64", extra_body={**FAST, "seed": seed}
    )
    assert pixels(decode(first.data[0].b64_json)) == pixels(
        decode(second.data[0].b64_json)
    )


@pytest.mark.parametrize(
    ("fmt", "pil_format"), [("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")]
)
def test_output_formats_b64_and_url(server, client, fmt: str, pil_format: str) -> None:
    b64 = client.images.generate(
        prompt="a fox", size="64x32", output_format=fmt, extra_body=FAST
    )
    assert b64.output_format == fmt
    assert decode(b64.data[0].b64_json).format == pil_format
    url = client.images.generate(
        prompt="a fox",
        size="64x32",
        output_format=fmt,
        response_format="url",
        output_compression=80,
        extra_body=FAST,
    )
    assert url.data[0].b64_json is None and url.data[0].url.endswith(f".{fmt}")
    # Image URLs are not public paths: with an API key set, fetching one needs it too.
    assert httpx.get(url.data[0].url).status_code == 401
    fetched = httpx.get(url.data[0].url, headers=server.auth)
    assert (
        fetched.status_code == 200 and fetched.headers["content-type"] == f"image/{fmt}"
    )
    img = Image.open(io.BytesIO(fetched.content))
    assert img.format == pil_format and img.size == (64, 32)


def test_stream_yields_one_progress_event_per_step(server) -> None:
    events = []
    with httpx.stream(
        "POST",
        server.url + "/v1/images/generations",
        timeout=120,
        headers=server.auth,
        json={
            "prompt": "a fox",
            "size": "64x64",
            "num_inference_steps": 3,
            "seed": 5,
            "stream": True,
        },
    ) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith(
            "text/event-stream"
        )
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert [(e["type"], e["step"], e["total_steps"]) for e in parsed[:-1]] == [
        ("progress", 1, 3),
        ("progress", 2, 3),
        ("progress", 3, 3),
    ]
    result = parsed[-1]
    assert result["type"] == "result" and result["diffserve"]["seeds"] == [5]
    assert decode(result["data"][0]["b64_json"]).size == (64, 64)


def test_v1_config_has_provenance(server, client) -> None:
    cfg = httpx.get(server.url + "/v1/config", headers=server.auth).json()
    assert cfg["pipeline"]["server.max_queue"]["value"] == 1
    assert cfg["pipeline"]["server.max_queue"]["source"] == "yaml"
    result = client.images.generate(prompt="x", size="64x64", extra_body=FAST)
    assert info(result)["config_fingerprint"] == cfg["fingerprint"]
