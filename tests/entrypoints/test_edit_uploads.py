"""``POST /v1/images/edits`` without a model: decoding and validation of uploads
(``uploads.py``), typing of the form (``edits.py``), and the endpoint in-process
(FastAPI's TestClient, the official ``openai`` client over it) against a fake engine
that records the ``GenerationRequest`` it is given."""

from __future__ import annotations

import io
import json
import struct
import zlib
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image
from starlette.datastructures import UploadFile

from diffserve.config.server_schema import ServerConfig
from diffserve.engine.load import ModelLoad, ReplicaLoad
from diffserve.entrypoints.openai.app import create_app
from diffserve.entrypoints.openai.edits import parse_form
from diffserve.entrypoints.openai.uploads import decode_edit_inputs
from diffserve.errors import RequestError
from diffserve.types.request import ProgressEvent, RequestOutput

LIMIT = 4 * 1048576  # input pixels: 4 x the default server.max_pixels


def encode(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def gradient(width: int = 40, height: int = 24) -> Image.Image:
    x = np.arange(width, dtype=np.uint8)[None, :, None].repeat(height, 0)
    y = np.arange(height, dtype=np.uint8)[:, None, None].repeat(width, 1)
    return Image.fromarray(
        np.concatenate([x * 3, y * 5, x + y], axis=2).astype(np.uint8), "RGB"
    )


def png_header(width: int, height: int, payload: bytes = b"") -> bytes:
    """A PNG declaring ``width`` x ``height`` whose pixel data is ``payload`` (garbage,
    or nothing)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", payload)
        + chunk(b"IEND", b"")
    )


def refused(
    images: list[bytes], mask: bytes | None = None, max_pixels: int = LIMIT
) -> RequestError:
    with pytest.raises(RequestError) as info:
        decode_edit_inputs(images, mask, max_pixels=max_pixels)
    assert info.value.code == "invalid_image"
    return info.value


# --- decoding
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_accepted_formats_decode_to_rgb_arrays(fmt: str) -> None:
    source = gradient()
    (array,), mask = decode_edit_inputs([encode(source, fmt)], None, max_pixels=LIMIT)
    assert mask is None and array.dtype == np.uint8 and array.shape == (24, 40, 3)
    if fmt == "PNG":  # lossless: the very pixels
        assert np.array_equal(array, np.asarray(source))


def test_alpha_and_palette_images_become_rgb() -> None:
    rgba = Image.new("RGBA", (16, 8), (10, 20, 30, 0))
    palette = gradient(16, 8).convert("P")
    arrays, _ = decode_edit_inputs(
        [encode(rgba), encode(palette), encode(Image.new("L", (5, 7), 9))],
        None,
        max_pixels=LIMIT,
    )
    assert [a.shape for a in arrays] == [(8, 16, 3), (8, 16, 3), (7, 5, 3)]
    assert arrays[0][0, 0].tolist() == [10, 20, 30]  # the stored colors, alpha dropped


def test_mask_with_alpha_follows_openai_transparent_is_edited() -> None:
    mask = Image.new("RGBA", (8, 4), (0, 0, 0, 255))
    mask.paste((255, 255, 255, 0), (0, 0, 4, 4))  # left half transparent: edit there
    mask.putpixel((7, 0), (0, 0, 0, 1))  # almost transparent is not transparent
    _, array = decode_edit_inputs(
        [encode(gradient(8, 4))], encode(mask), max_pixels=LIMIT
    )
    assert array.dtype == np.uint8 and array.shape == (4, 8)
    assert (array[:, :4] == 255).all() and (array[:, 4:] == 0).all()


def test_mask_without_alpha_follows_diffusers_white_is_edited() -> None:
    gray = Image.fromarray(
        np.array([[0, 100, 127, 128, 200, 255]], dtype=np.uint8), "L"
    )
    _, array = decode_edit_inputs(
        [encode(gradient(6, 1))], encode(gray), max_pixels=LIMIT
    )
    assert array.tolist() == [[0, 0, 0, 255, 255, 255]]
    rgb = Image.new("RGB", (6, 1), (255, 255, 255))
    _, array = decode_edit_inputs(
        [encode(gradient(6, 1))], encode(rgb, "JPEG"), max_pixels=LIMIT
    )
    assert (array == 255).all()


def test_palette_mask_with_a_transparent_index() -> None:
    mask = Image.new("P", (4, 2), 0)
    mask.putpalette([0, 0, 0, 255, 255, 255])
    mask.putpixel((1, 1), 1)
    buf = io.BytesIO()
    mask.save(buf, format="PNG", transparency=1)
    _, array = decode_edit_inputs(
        [encode(gradient(4, 2))], buf.getvalue(), max_pixels=LIMIT
    )
    assert array.tolist() == [[0, 0, 0, 0], [0, 255, 0, 0]]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not an image at all",
        b"\x89PNG\r\n\x1a\n" + b"\x00" * 40,
        encode(gradient(), "GIF"),
        encode(gradient(), "BMP"),
        encode(gradient(), "TIFF"),
    ],
    ids=["empty", "text", "broken-png", "gif", "bmp", "tiff"],
)
def test_non_images_and_other_formats_are_refused(data: bytes) -> None:
    assert refused([data]).param == "image"
    assert refused([encode(gradient())], data).param == "mask"


def test_truncated_files_are_refused_when_decoded() -> None:
    good = encode(gradient(64, 64))
    assert refused([good[: len(good) // 2]]).param == "image"
    jpeg = encode(gradient(64, 64), "JPEG")
    assert "decoded" in str(refused([jpeg[: len(jpeg) * 2 // 3]]))


@pytest.mark.parametrize(
    ("width", "height"), [(30000, 30000), (5000, 5000), (9000, 10), (0, 10)]
)
def test_huge_declared_sizes_are_refused_from_the_header(
    width: int, height: int
) -> None:
    # No pixel data at all: decoding would fail differently, so the refusal is the
    # header's.
    error = refused([png_header(width, height)])
    assert error.param == "image" and ("pixels" in str(error) or "PNG" in str(error))


def test_every_header_is_checked_before_anything_is_decoded() -> None:
    truncated = encode(gradient(64, 64))[:200]  # would fail only when decoded
    error = refused([truncated, png_header(5000, 5000)])
    assert "5000x5000" in str(error)
    # The mask's size is read from its header too: garbage pixels, but the size is the
    # refusal.
    error = refused([encode(gradient(32, 32))], png_header(16, 16, b"garbage"))
    assert error.param == "mask" and "16x16" in str(error) and "32x32" in str(error)


def test_the_pixel_bound_is_the_callers() -> None:
    assert refused([encode(gradient(40, 24))], max_pixels=40 * 24 - 1).param == "image"
    assert decode_edit_inputs([encode(gradient(40, 24))], None, max_pixels=40 * 24)[0][
        0
    ].shape == (24, 40, 3)


# --- the form
# --------------------------------------------------------------------------------------
def upload(data: bytes = b"x", name: str = "in.png") -> UploadFile:
    return UploadFile(io.BytesIO(data), filename=name)


def form(*extra: tuple[str, object], image: bool = True) -> list[tuple[str, object]]:
    return ([("image", upload())] if image else []) + [("prompt", "a fox"), *extra]


def test_text_fields_are_typed_by_name() -> None:
    body, images, mask = parse_form(
        form(
            ("n", "2"),
            ("strength", "0.6"),
            ("seed", "7"),
            ("stream", "true"),
            ("num_inference_steps", "4"),
            ("guidance_scale", "1e-1"),
            ("true_cfg_scale", "1.5"),
            ("negative_prompt", "blur"),
            ("max_sequence_length", "64"),
            ("size", "64x32"),
            ("mask", upload()),
            ("output_format", "webp"),
            ("response_format", "url"),
            ("user", "u"),
        )
    )
    assert (
        body.n,
        body.strength,
        body.seed,
        body.stream,
        body.num_inference_steps,
    ) == (2, 0.6, 7, True, 4)
    assert (body.guidance_scale, body.true_cfg_scale, body.max_sequence_length) == (
        0.1,
        1.5,
        64,
    )
    assert (
        body.size,
        body.output_format,
        body.response_format,
        body.negative_prompt,
    ) == ("64x32", "webp", "url", "blur")
    assert len(images) == 1 and mask is not None
    # The SDK sends None as "": unset.
    body, _, _ = parse_form(form(("seed", ""), ("strength", "")))
    assert body.seed is None and body.strength is None


def test_loras_as_json_text_or_as_the_sdk_flattens_them() -> None:
    body, _, _ = parse_form(
        form(("loras", json.dumps([{"name": "style", "scale": 0.8}])))
    )
    assert [(c.name, c.scale) for c in body.loras] == [("style", 0.8)]
    body, _, _ = parse_form(
        form(("loras[][name]", "a"), ("loras[][scale]", "0.5"), ("loras[][name]", "b"))
    )
    assert [(c.name, c.scale) for c in body.loras] == [("a", 0.5), ("b", 1.0)]


def test_several_images_keep_their_order() -> None:
    first, second = upload(b"1"), upload(b"2")
    _, images, _ = parse_form(
        [("image[]", first), ("prompt", "x"), ("image[]", second)]
    )
    assert images == [first, second]


@pytest.mark.parametrize(
    ("items", "param", "code"),
    [
        (form(image=False), "image", "missing_parameter"),
        ([("image", "text, not a file"), ("prompt", "x")], "image", "invalid_value"),
        (form(("mask", "text")), "mask", "invalid_value"),
        (form(("mask", upload()), ("mask", upload())), "mask", "invalid_value"),
        (
            [("image[]", upload()) for _ in range(5)] + [("prompt", "x")],
            "image",
            "invalid_value",
        ),
        ([("image", upload()), ("prompt", upload())], "prompt", "invalid_value"),
        (form(("prompt", "again")), "prompt", "invalid_value"),
        ([("image", upload())], "prompt", "missing_parameter"),
        (form(("n", "two")), "n", "invalid_value"),
        (form(("n", "2.0")), "n", "invalid_value"),
        (form(("n", "0")), "n", "invalid_value"),
        (form(("strength", "0")), "strength", "invalid_value"),
        (form(("strength", "1.5")), "strength", "invalid_value"),
        (form(("strength", "nan")), "strength", "invalid_value"),
        (form(("guidance_scale", "1e400")), "guidance_scale", "invalid_value"),
        (form(("seed", "-1")), "seed", "invalid_value"),
        (form(("stream", "yes")), "stream", "invalid_value"),
        (form(("output_format", "gif")), "output_format", "invalid_value"),
        (form(("loras", "[{")), "loras", "invalid_value"),
        (form(("loras", "[" * 100 + "]" * 100)), "loras", "invalid_value"),
        (form(("loras[][scale]", "1")), "loras", "invalid_value"),
        (form(("loras", "[]"), ("loras[][name]", "a")), "loras", "invalid_value"),
        (form(("bogus", "1")), "bogus", "unknown_parameter"),
        (form(("quality", "high")), "quality", "unsupported_parameter"),
        (form(("input_fidelity", "high")), "input_fidelity", "unsupported_parameter"),
    ],
)
def test_bad_fields_name_themselves(items: list, param: str, code: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_form(items)
    assert (info.value.param, info.value.code) == (param, code)


# --- the endpoint, in-process
# ---------------------------------------------------------------------------
class FakeEngine:
    """Answers every request with gray images of the size admission would pick, and
    keeps the requests."""

    config = None
    is_ready, is_dead, queue_depth, replicas_live, num_replicas = True, False, 0, 1, 1
    loop_state, heartbeat_age_s = "idle", 0.0
    stage_health = [
        {
            "stage_id": 0,
            "role": "diffusion",
            "replicas_live": 1,
            "replicas": 1,
            "queue_depth": 0,
        }
    ]
    load = ModelLoad(replicas=(ReplicaLoad(0, True),))

    def __init__(self) -> None:
        self.requests: list = []

    def add_stats_listener(self, listener) -> None:
        pass

    async def generate(self, request):
        self.requests.append(request)
        height = request.height or request.images[0].shape[0] // 16 * 16
        width = request.width or request.images[0].shape[1] // 16 * 16
        seed = request.seed if request.seed is not None else 5
        yield ProgressEvent(request.request_id, 1, 1)
        yield RequestOutput(
            request.request_id,
            [Image.new("RGB", (width, height), 128)] * request.n,
            [seed + i for i in range(request.n)],
            {"denoise": 1.0},
            {"executor": "fake"},
            "f00d",
            width=width,
            height=height,
            num_inference_steps=request.num_inference_steps or 1,
        )

    async def abort(self, request_id: str) -> bool:
        return True

    def shutdown(self) -> None:
        pass


@pytest.fixture()
def served():
    engine = FakeEngine()
    config = SimpleNamespace(
        server=ServerConfig(max_upload_bytes=200_000, max_pixels=128 * 128)
    )
    with TestClient(
        create_app(engine, config=config, served_model_name="tiny-flux")
    ) as http:
        yield engine, http


def test_the_openai_client_edits_unmodified(served) -> None:
    import openai

    engine, http = served
    client = openai.OpenAI(
        base_url="http://testserver/v1",
        api_key="unused",
        http_client=http,
        max_retries=0,
    )
    source = gradient(70, 50)
    mask = Image.new("RGBA", (70, 50), (0, 0, 0, 255))
    mask.paste((0, 0, 0, 0), (10, 10, 30, 20))
    result = client.images.edit(
        model="tiny-flux",
        image=("in.png", encode(source), "image/png"),
        prompt="a fox",
        mask=("m.png", encode(mask), "image/png"),
        extra_body={
            "strength": 0.6,
            "seed": 1,
            "num_inference_steps": 4,
            "loras": [{"name": "style", "scale": 0.5}],
        },
    )
    gen = engine.requests[-1]
    assert (gen.strength, gen.seed, gen.num_inference_steps, gen.loras) == (
        0.6,
        1,
        4,
        (("style", 0.5),),
    )
    # No size: admission takes the image's.
    assert gen.width is None and gen.height is None
    assert np.array_equal(gen.images[0], np.asarray(source))
    assert (
        gen.mask.shape == (50, 70)
        and gen.mask[10:20, 10:30].min() == 255
        and gen.mask.sum() == 255 * 200
    )
    assert result.size == "64x48" and result.model_extra["diffserve"]["seeds"] == [1]
    image = Image.open(
        io.BytesIO(__import__("base64").b64decode(result.data[0].b64_json))
    )
    assert image.size == (64, 48) and image.text["strength"] == "0.6"
    # Several images (the SDK's image[]), a size and n.
    client.images.edit(
        image=[("a.png", encode(source)), ("b.webp", encode(gradient(20, 20), "WEBP"))],
        prompt="x",
        size="32x32",
        n=2,
    )
    gen = engine.requests[-1]
    assert [a.shape for a in gen.images] == [(50, 70, 3), (20, 20, 3)] and (
        gen.width,
        gen.height,
        gen.n,
    ) == (32, 32, 2)
    with pytest.raises(openai.BadRequestError) as info:
        client.images.edit(image=("in.png", b"corrupt"), prompt="x")
    assert (
        info.value.body["param"] == "image"
        and info.value.body["code"] == "invalid_image"
    )
    with pytest.raises(openai.NotFoundError):
        client.images.edit(
            model="dall-e-2", image=("in.png", encode(source)), prompt="x"
        )


def test_stream_sends_progress_then_the_result(served) -> None:
    _, http = served
    resp = http.post(
        "/v1/images/edits",
        files={"image": ("in.png", encode(gradient(32, 32)), "image/png")},
        data={"prompt": "x", "stream": "true"},
    )
    assert resp.status_code == 200 and resp.headers["content-type"].startswith(
        "text/event-stream"
    )
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert (
        json.loads(events[0])["type"] == "progress"
        and json.loads(events[-2])["type"] == "result"
    )
    assert events[-1] == "[DONE]"


def error_of(resp: httpx.Response) -> tuple[int, str | None, str | None]:
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return resp.status_code, error["param"], error["code"]


def test_bad_uploads_are_refused_and_the_server_keeps_serving(served) -> None:
    engine, http = served
    good = ("in.png", encode(gradient(32, 32)), "image/png")
    post = lambda **kw: http.post("/v1/images/edits", **kw)  # noqa: E731
    cases = [
        (
            post(
                files={"image": ("x.png", b"\x00garbage", "image/png")},
                data={"prompt": "x"},
            ),
            (400, "image"),
        ),
        (
            post(
                files={"image": ("x.gif", encode(gradient(), "GIF"), "image/gif")},
                data={"prompt": "x"},
            ),
            (400, "image"),
        ),
        (
            post(
                files={"image": ("x.png", png_header(100000, 100000), "image/png")},
                data={"prompt": "x"},
            ),
            (400, "image"),
        ),
        (
            post(
                files={
                    "image": good,
                    "mask": ("m.png", encode(Image.new("L", (16, 32))), "image/png"),
                },
                data={"prompt": "x"},
            ),
            (400, "mask"),
        ),
        (post(files=[("image[]", good)] * 7, data={"prompt": "x"}), (400, "image")),
        (
            post(files={"image": good}, data={"prompt": "x", "strength": "2"}),
            (400, "strength"),
        ),
        (
            post(
                files={"image": ("big.png", b"\x00" * 300_000, "image/png")},
                data={"prompt": "x"},
            ),
            (413, None),
        ),
        (
            post(
                content=iter([b"--b\r\n", b"\x00" * 300_000]),
                headers={
                    "Content-Type": "multipart/form-data; boundary=b",
                    "Transfer-Encoding": "chunked",
                },
            ),
            (413, None),
        ),
        (post(json={"prompt": "x"}), (415, "Content-Type")),
        (
            post(
                content=b"garbage",
                headers={"Content-Type": "multipart/form-data; boundary=zz"},
            ),
            (400, None),
        ),
        (
            post(content=b"x", headers={"Content-Type": "multipart/form-data"}),
            (400, None),
        ),
    ]
    for resp, expected in cases:
        status, param, _ = error_of(resp)
        assert (status, param) == expected, resp.text
    assert engine.requests == []  # nothing reached the engine
    assert post(files={"image": good}, data={"prompt": "x"}).status_code == 200
    # Generations stay JSON-only; a multipart body there is 415.
    assert (
        http.post(
            "/v1/images/generations", files={"image": good}, data={"prompt": "x"}
        ).status_code
        == 415
    )
    assert 'endpoint="/v1/images/edits",status="400"' in http.get("/metrics").text


def test_not_ready_is_503_before_decoding(served) -> None:
    engine, http = served
    engine.is_ready = False
    resp = http.post(
        "/v1/images/edits",
        files={"image": ("x.png", b"corrupt", "image/png")},
        data={"prompt": "x"},
    )
    assert error_of(resp)[0] == 503
