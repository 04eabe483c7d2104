"""Partial images over HTTP: ``stream: true`` with ``partial_images`` on the real
server (``uni_server``: tiny FLUX, uni executor), read with the official ``openai``
client's streaming images API and as raw server-sent events; the streamed image equals
the non-streamed one byte for byte, and bad combinations are 400 naming the field."""

from __future__ import annotations

import base64
import io
import json

import httpx
import openai
import pytest
from PIL import Image

pytestmark = pytest.mark.e2e

MODEL = "tiny-flux"
STEPS = {"num_inference_steps": 6, "seed": 5}


@pytest.fixture(scope="module")
def server(uni_server):
    return uni_server


def decode(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def raw_events(server, path: str, body: dict) -> list[tuple[str, dict]]:
    events, name = [], None
    with httpx.stream(
        "POST", server.url + path, timeout=120, headers=server.auth, json=body
    ) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: ") :])))
    return events


def test_the_sdk_streams_partial_images_then_the_unchanged_image(client) -> None:
    stream = client.images.generate(
        model=MODEL,
        prompt="a fox in the snow",
        size="64x64",
        stream=True,
        partial_images=2,
        extra_body=STEPS,
    )
    events = list(stream)
    assert [e.type for e in events] == [
        "image_generation.partial_image",
        "image_generation.partial_image",
        "image_generation.completed",
    ]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    for event in events[:2]:
        assert decode(event.b64_json).size == (64, 64)
        assert event.size == "64x64" and event.output_format == "png"
    completed = events[-1]
    assert completed.usage.total_tokens == 0
    assert completed.model_extra["diffserve"]["seeds"] == [5]
    plain = client.images.generate(
        model=MODEL, prompt="a fox in the snow", size="64x64", extra_body=STEPS
    )
    assert completed.b64_json == plain.data[0].b64_json
    # A preview is a real decode of the running latents, not the final image.
    assert all(e.b64_json != completed.b64_json for e in events[:2])


def test_raw_sse_names_each_event_and_completes_every_image(server) -> None:
    events = raw_events(
        server,
        "/v1/images/generations",
        {
            "prompt": "a house",
            "size": "64x64",
            "n": 2,
            "stream": True,
            "partial_images": 1,
            "output_format": "jpeg",
            **STEPS,
        },
    )
    assert [(name, e["type"]) for name, e in events] == [
        ("image_generation.partial_image", "image_generation.partial_image")
    ] * 2 + [("image_generation.completed", "image_generation.completed")] * 2
    assert [(e["partial_image_index"], e["image_index"]) for _, e in events[:2]] == [
        (0, 0),
        (0, 1),
    ]
    assert [e["image_index"] for _, e in events[2:]] == [0, 1]
    assert all(decode(e["b64_json"]).format == "JPEG" for _, e in events)
    # partial_images 0: OpenAI's shape with the completed events only.
    none = raw_events(
        server,
        "/v1/images/generations",
        {"prompt": "a house", "size": "64x64", "stream": True, "partial_images": 0},
    )
    assert [name for name, _ in none] == ["image_generation.completed"]


def test_edits_stream_their_partial_images(client) -> None:
    source = io.BytesIO()
    Image.new("RGB", (64, 64), (30, 90, 200)).save(source, format="PNG")
    events = list(
        client.images.edit(
            model=MODEL,
            image=("in.png", source.getvalue(), "image/png"),
            prompt="a red fox",
            stream=True,
            partial_images=1,
            extra_body={"strength": 1.0, **STEPS},
        )
    )
    assert [e.type for e in events] == [
        "image_edit.partial_image",
        "image_edit.completed",
    ]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"partial_images": 2}, "partial_images"),  # without stream
        ({"partial_images": 4, "stream": True}, "partial_images"),
        ({"partial_images": -1, "stream": True}, "partial_images"),
        (
            {"partial_images": 1, "stream": True, "response_format": "url"},
            "response_format",
        ),
    ],
)
def test_bad_partial_images_are_400_naming_the_field(server, extra, param) -> None:
    resp = httpx.post(
        server.url + "/v1/images/generations",
        headers=server.auth,
        timeout=60,
        json={"prompt": "x", "size": "64x64", **extra},
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param
    # The server keeps serving.
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_an_admission_error_keeps_its_status_through_the_sdk(client) -> None:
    with pytest.raises(openai.UnprocessableEntityError):
        list(
            client.images.generate(
                model=MODEL,
                prompt="x",
                size="64x64",
                stream=True,
                partial_images=1,
                extra_body={"num_inference_steps": 100000},
            )
        )
