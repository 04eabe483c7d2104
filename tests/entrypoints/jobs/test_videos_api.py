"""``/v1/videos`` as a contract over raw HTTP (httpx, no SDK): OpenAI's Videos API shut
down on 2026-09-24 and diffserve keeps its shape as a community contract, specified by
docs/api.md ("Videos"). One real ``diffserve serve`` of two video models: toy-motion (a
trained tiny Wan2.1, text-to-video: its MP4 is read back and shows its prompt) and the
tiny Wan2.2 image-to-video (a multipart first frame). Every route: create (JSON,
multipart, ``Idempotency-Key``), retrieve, list (pages), delete, content (video /
thumbnail / spritesheet); the video object's fields and types, statuses queued ->
in_progress -> completed, headers, and OpenAI-shaped errors for bad input; the routes of
OpenAI's API not served here; the API key on every route; one cheap SDK smoke test; and
the playground's video tab."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from diffserve.provenance.verify import verify_bytes
from diffserve.zoo.toy_motion.checker import read_clip
from diffserve.zoo.toy_motion.grammar import parse_prompt

API_KEY = "video-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
TOY, I2V = "toy-motion", "tiny-i2v"
CHEAP = {
    "model": TOY,
    "prompt": "a ball",
    "size": "64x48",
    "num_frames": 5,
    "num_inference_steps": 1,
    "seed": 3,
}
UNKNOWN_ID = "video_" + "0" * 32
VIDEO_KEYS = {
    "id",
    "object",
    "model",
    "prompt",
    "revised_prompt",
    "status",
    "progress",
    "created_at",
    "completed_at",
    "expires_at",
    "size",
    "seconds",
    "remixed_from_video_id",
    "error",
    "diffserve",
}
RUN_KEYS = {
    "seed",
    "num_inference_steps",
    "num_frames",
    "fps",
    "guidance_scale",
    "instance",
}
STATUSES = ["queued", "in_progress", "completed"]


@pytest.fixture(scope="module")
def server(server_launcher, write_deploy, tmp_path_factory, tiny_wan22_i2v_dir):
    from diffserve.zoo.wan import toy_motion_dir

    state = tmp_path_factory.mktemp("state")
    common = (
        "    dtype: float32\n    enforce_eager: true\n    warmup: {enabled: false}\n"
    )
    deploy = write_deploy(
        f"models:\n  - model: {toy_motion_dir()}\n    name: {TOY}\n{common}"
        f"  - model: {tiny_wan22_i2v_dir}\n    name: {I2V}\n{common}"
    )
    with server_launcher(
        "--deploy-config", deploy, "--api-key", API_KEY, "--state-dir", state
    ) as proc:
        proc.state_dir = state
        yield proc


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
        yield client


def create(http: httpx.Client, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    answer = http.post("/v1/videos", json=body, **kwargs)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    video = answer.json()
    assert answer.headers["x-request-id"] == video["id"]
    check_video(video)
    assert video["status"] == "queued" and video["progress"] == 0, video
    return video


def wait(
    http: httpx.Client, video_id: str, timeout: float = 120.0
) -> tuple[dict[str, Any], list[str]]:
    """The finished video object and the statuses seen on the way (progress never goes
    back)."""
    seen: list[str] = []
    progress = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = http.get(f"/v1/videos/{video_id}").json()
        check_video(video)
        assert video["progress"] >= progress, (video, progress)
        progress = video["progress"]
        if not seen or seen[-1] != video["status"]:
            seen.append(video["status"])
        if video["status"] in ("completed", "failed"):
            return video, seen
        time.sleep(0.02)
    raise TimeoutError(f"{video_id} still {seen[-1]} after {timeout} s")


def check_video(video: dict[str, Any]) -> None:
    """The video object's fields and their types (docs/api.md)."""
    assert set(video) == VIDEO_KEYS, sorted(video)
    assert video["object"] == "video" and video["remixed_from_video_id"] is None
    assert video["id"].startswith("video_") and len(video["id"]) == len("video_") + 32
    assert video["status"] in ("queued", "in_progress", "completed", "failed")
    assert isinstance(video["progress"], int) and 0 <= video["progress"] <= 100
    assert isinstance(video["created_at"], int)
    for name in ("completed_at", "expires_at"):
        assert video[name] is None or isinstance(video[name], int), (name, video)
    assert all(
        isinstance(video[k], str) for k in ("model", "prompt", "size", "seconds")
    )
    assert (video["completed_at"] is None) == (video["status"] != "completed"), video
    assert (video["error"] is None) == (video["status"] != "failed"), video
    run = video["diffserve"]
    ran = (
        {"attestation", "config_fingerprint", "timings_ms"}
        if video["status"] == "completed"
        else set()
    )
    assert (
        set(run) == RUN_KEYS | ran
        and isinstance(run["seed"], int)
        and isinstance(run["num_frames"], int)
    ), run


def check_error(
    answer: httpx.Response, status: int, code: str, param: str | None = None
) -> None:
    """OpenAI's error body: exactly ``{"error": {"message", "type", "param",
    "code"}}``."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }, body
    error = body["error"]
    assert (
        isinstance(error["message"], str)
        and error["message"]
        and isinstance(error["type"], str)
    ), body
    assert (error["code"], error["param"]) == (code, param), body


def png(width: int, height: int, colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def decode_mp4(data: bytes) -> tuple[np.ndarray, dict[str, str], float]:
    """Frames, container tags and fps, read with PyAV (not the server's own reader)."""
    with av.open(io.BytesIO(data)) as container:
        frames = [
            frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)
        ]
        return (
            np.stack(frames),
            dict(container.metadata),
            float(container.streams.video[0].average_rate),
        )


def newest_id(http: httpx.Client) -> str | None:
    return http.get("/v1/videos", params={"limit": 1}).json()["first_id"]


def test_a_json_job_runs_to_completed_and_downloads_as_mp4_thumbnail_and_spritesheet(
    http, server
) -> None:
    prompt = "a yellow square moving right on a black background"
    video = create(
        http,
        {
            "model": TOY,
            "prompt": prompt,
            "seconds": 2,
            "size": "64x64",  # seconds: a number
            "num_inference_steps": 24,
            "fps": 8,
            "seed": 3,
        },
    )
    assert (video["size"], video["seconds"], video["model"], video["prompt"]) == (
        "64x64",
        "2",
        TOY,
        prompt,
    )
    # 2 s at 8 fps: 4k+1 = 17.
    assert video["expires_at"] is None and video["diffserve"]["num_frames"] == 17
    done, seen = wait(http, video["id"])
    # In order, none skipped from the first seen.
    assert seen == STATUSES[STATUSES.index(seen[0]) :], seen
    assert done["status"] == "completed" and "in_progress" in seen, (done, seen)
    assert done["progress"] == 100 and done["completed_at"] >= done["created_at"]
    # Video_ttl_s' default.
    assert done["expires_at"] == pytest.approx(done["completed_at"] + 86400, abs=2)
    run = done["diffserve"]
    assert (run["seed"], run["num_inference_steps"], run["fps"]) == (3, 24, 8)
    assert run["attestation"]["linear"] and isinstance(run["config_fingerprint"], str)

    answer = http.get(f"/v1/videos/{video['id']}/content")
    assert answer.status_code == 200 and answer.headers["content-type"] == "video/mp4"
    assert (
        answer.headers["content-disposition"] == f'inline; filename="{video["id"]}.mp4"'
    )
    assert answer.content[4:8] == b"ftyp"
    frames, tags, fps = decode_mp4(answer.content)
    assert frames.shape == (17, 64, 64, 3) and fps == 8 and tags["seed"] == "3"
    # The job's MP4 carries its signed provenance manifest, bound to its packets.
    verdict = verify_bytes(answer.content)
    assert verdict.valid, verdict.reason
    assert verdict.generation["seed"] == 3
    assert verdict.generation["config_fingerprint"] == run["config_fingerprint"]
    # What the MP4 shows, through H.264: the prompt's background, object colour and
    # direction (shape is the statistical test's, tests/zoo/test_toy_motion_model.py:
    # one clip may miss it).
    asked, read = parse_prompt(prompt), read_clip(list(frames)).scene
    assert (read.background, read.colour, read.direction) == (
        asked.background,
        asked.colour,
        asked.direction,
    ), read
    thumbnail = http.get(
        f"/v1/videos/{video['id']}/content", params={"variant": "thumbnail"}
    )
    assert thumbnail.headers["content-type"] == "image/webp"
    assert thumbnail.headers["content-disposition"].endswith(
        f'filename="{video["id"]}.webp"'
    )
    first = np.asarray(Image.open(io.BytesIO(thumbnail.content)))
    assert first.shape == (64, 64, 3)
    # The thumbnail is the first frame losslessly; the MP4's first frame is it through
    # H.264.
    assert np.abs(first.astype(int) - frames[0].astype(int)).mean() < 6
    sheet = http.get(
        f"/v1/videos/{video['id']}/content", params={"variant": "spritesheet"}
    )
    assert sheet.headers["content-type"] == "image/jpeg"
    assert sheet.headers["content-disposition"].endswith(
        f'filename="{video["id"]}.jpg"'
    )
    image = Image.open(io.BytesIO(sheet.content))
    # 16 of the 17 frames, 4 columns.
    assert image.format == "JPEG" and image.size == (4 * 64, 4 * 64)
    check_error(
        http.get(f"/v1/videos/{video['id']}/content", params={"variant": "poster"}),
        400,
        "invalid_value",
        "variant",
    )

    deleted = http.delete(f"/v1/videos/{video['id']}")
    assert deleted.status_code == 200 and deleted.json() == {
        "id": video["id"],
        "object": "video.deleted",
        "deleted": True,
    }
    check_error(
        http.get(f"/v1/videos/{video['id']}"), 404, "video_not_found", "video_id"
    )
    check_error(
        http.get(f"/v1/videos/{video['id']}/content"),
        404,
        "video_not_found",
        "video_id",
    )
    check_error(
        http.delete(f"/v1/videos/{video['id']}"), 404, "video_not_found", "video_id"
    )
    assert not any(server.state_dir.glob(f"**/{video['id']}*"))


def test_multipart_with_an_input_image_starts_an_image_to_video_job(
    http, server
) -> None:
    first_frame = png(64, 48)
    fields = {
        "model": I2V,
        "prompt": "a red ball",
        "num_frames": "5",
        "num_inference_steps": "1",
        "seed": "5",
    }
    answer = http.post(
        "/v1/videos",
        data=fields,
        files={"input_reference": ("frame.png", first_frame, "image/png")},
    )
    assert answer.status_code == 200, answer.text
    video = answer.json()
    check_video(video)
    # Text fields are typed by name; the size is the image's; the first frame is kept
    # with the job.
    run = video["diffserve"]
    assert (video["model"], video["status"], video["size"]) == (I2V, "queued", "64x48")
    # Frames / fps.
    assert (run["seed"], run["num_frames"], video["seconds"]) == (
        5,
        5,
        f"{5 / run['fps']:g}",
    )
    assert len(list(server.state_dir.glob(f"**/{video['id']}.input.png"))) == 1
    done, _ = wait(http, video["id"])
    assert done["status"] == "completed", done
    frames, _, _ = decode_mp4(http.get(f"/v1/videos/{video['id']}/content").content)
    assert frames.shape == (5, 48, 64, 3)
    # The same first frame in JSON, as a data URL.
    data_url = "data:image/png;base64," + base64.b64encode(first_frame).decode()
    same = create(
        http,
        {
            "model": I2V,
            "prompt": "a red ball",
            "num_frames": 5,
            "num_inference_steps": 1,
            "input_reference": {"image_url": data_url},
        },
    )
    assert same["size"] == "64x48"
    for job in (video, same):
        assert http.delete(f"/v1/videos/{job['id']}").json()["deleted"] is True
    assert not any(server.state_dir.glob(f"**/{video['id']}*"))


def test_an_input_image_is_checked_and_a_text_to_video_model_refuses_it(http) -> None:
    before = newest_id(http)
    upload = {"input_reference": ("frame.png", png(64, 48), "image/png")}
    # toy-motion makes videos from text only: the first frame is refused naming it, and
    # no job is stored.
    check_error(
        http.post("/v1/videos", data={"model": TOY, "prompt": "a ball"}, files=upload),
        400,
        "invalid_value",
        "image",
    )
    data_url = "data:image/png;base64," + base64.b64encode(png(64, 48)).decode()
    check_error(
        http.post(
            "/v1/videos", json={**CHEAP, "input_reference": {"image_url": data_url}}
        ),
        400,
        "invalid_value",
        "image",
    )
    for reference in (
        {"image_url": "https://example.com/a.png"},
        {"image_url": "data:image/png;base64,%%"},
    ):
        check_error(
            http.post(
                "/v1/videos", json={**CHEAP, "model": I2V, "input_reference": reference}
            ),
            400,
            "invalid_value",
            "input_reference",
        )
    for files in (
        {"input_reference": (None, "not a file")},  # a text field
        {
            "input_reference": ("big.png", png(4096, 4096), "image/png")
        },  # over the pixel limit
        {"input_reference": ("a.png", b"not an image", "image/png")},
    ):
        answer = http.post(
            "/v1/videos", data={"model": I2V, "prompt": "a ball"}, files=files
        )
        assert (
            answer.status_code == 400
            and answer.json()["error"]["param"] == "input_reference"
        ), answer.text
    assert newest_id(http) == before


def test_list_pages_newest_or_oldest_first(http) -> None:
    a, b, c = (create(http, {**CHEAP, "prompt": f"ball {i}"})["id"] for i in range(3))
    # Order=desc is the default.
    page = http.get("/v1/videos", params={"limit": 2}).json()
    assert (
        set(page) == {"object", "data", "first_id", "last_id", "has_more"}
        and page["object"] == "list"
    )
    assert [v["id"] for v in page["data"]] == [c, b] and (
        page["first_id"],
        page["last_id"],
    ) == (c, b)
    assert page["has_more"] is True
    for item in page["data"]:
        check_video(item)
    after = http.get(
        "/v1/videos", params={"limit": 2, "after": b, "order": "desc"}
    ).json()
    assert after["data"][0]["id"] == a
    oldest = http.get(
        "/v1/videos", params={"limit": 2, "after": a, "order": "asc"}
    ).json()
    assert [v["id"] for v in oldest["data"]] == [b, c] and oldest["has_more"] is False
    assert http.get("/v1/videos").json()["first_id"] == c
    empty = http.get("/v1/videos", params={"order": "asc", "after": c}).json()
    assert empty == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
    for video_id in (a, b, c):
        assert http.delete(f"/v1/videos/{video_id}").json()["deleted"] is True
    assert not {a, b, c} & {
        v["id"] for v in http.get("/v1/videos", params={"limit": 100}).json()["data"]
    }


@pytest.mark.parametrize(
    ("params", "code", "param"),
    [
        ({"limit": "0"}, "invalid_value", "limit"),
        ({"limit": "101"}, "invalid_value", "limit"),
        ({"limit": "ten"}, "invalid_value", "limit"),
        ({"order": "newest"}, "invalid_value", "order"),
        ({"after": "nope"}, "invalid_value", "after"),
        ({"after": UNKNOWN_ID}, "invalid_value", "after"),
        ({"page": "2"}, "unknown_parameter", "page"),
    ],
)
def test_bad_list_parameters_are_400_naming_them(
    http, params: dict[str, str], code: str, param: str
) -> None:
    check_error(http.get("/v1/videos", params=params), 400, code, param)


def test_content_is_404_until_the_job_completes(http) -> None:
    # Server.max_steps: runs for a while.
    video = create(http, {**CHEAP, "num_inference_steps": 100})
    check_error(
        http.get(f"/v1/videos/{video['id']}/content"),
        404,
        "video_not_ready",
        "video_id",
    )
    assert http.get(f"/v1/videos/{video['id']}").json()["status"] in (
        "queued",
        "in_progress",
    )
    # Aborted at its next step.
    assert http.delete(f"/v1/videos/{video['id']}").json()["deleted"] is True
    check_error(
        http.get(f"/v1/videos/{video['id']}/content"),
        404,
        "video_not_found",
        "video_id",
    )


def test_an_idempotency_key_answers_its_job_again(http) -> None:
    first = create(http, CHEAP, headers={"Idempotency-Key": "job-42"})
    again = create(http, CHEAP, headers={"Idempotency-Key": "job-42"})
    # No second job.
    assert again["id"] == first["id"] and newest_id(http) == first["id"]
    check_error(
        http.post(
            "/v1/videos",
            json={**CHEAP, "seed": 4},
            headers={"Idempotency-Key": "job-42"},
        ),
        409,
        "idempotency_conflict",
        "Idempotency-Key",
    )
    for key in ("two words", "k" * 257):
        check_error(
            http.post("/v1/videos", json=CHEAP, headers={"Idempotency-Key": key}),
            400,
            "invalid_value",
            "Idempotency-Key",
        )
    other = create(http, CHEAP)  # no key: every POST is a new job
    assert other["id"] != first["id"]
    for video in (first, other):
        http.delete(f"/v1/videos/{video['id']}")


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"seconds": "-1"}, "invalid_value", "seconds"),
        ({"seconds": "four"}, "invalid_value", "seconds"),
        ({"size": "60x48"}, "invalid_value", "size"),
        ({"num_frames": 8}, "invalid_value", "num_frames"),
        ({"resolution": "hd"}, "unknown_parameter", "resolution"),
        ({"seed": "x"}, "invalid_value", "seed"),
        ({"prompt": ""}, "invalid_value", "prompt"),
    ],
)
def test_a_bad_multipart_field_is_400_naming_it(
    http, server, fields: dict[str, Any], code: str, param: str
) -> None:
    data = {
        "prompt": "a ball",
        "size": "64x48",
        "num_frames": "5",
        **{k: str(v) for k, v in fields.items()},
    }
    answer = http.post(
        "/v1/videos", files=[(name, (None, value)) for name, value in data.items()]
    )
    check_error(answer, 400, code, param)
    assert httpx.get(server.url + "/ready", timeout=10).status_code == 200


def test_a_bad_json_body_model_or_content_type_is_refused(http) -> None:
    check_error(
        http.post("/v1/videos", json={"size": "64x48"}),
        400,
        "missing_parameter",
        "prompt",
    )
    check_error(http.post("/v1/videos", json=["a ball"]), 400, "invalid_json")
    check_error(
        http.post(
            "/v1/videos",
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        ),
        400,
        "invalid_json",
    )
    check_error(
        http.post("/v1/videos", json={**CHEAP, "seed": True}),
        400,
        "invalid_value",
        "seed",
    )
    check_error(
        http.post("/v1/videos", json={**CHEAP, "model": "sora-2"}),
        404,
        "model_not_found",
        "model",
    )
    check_error(
        http.post(
            "/v1/videos",
            content=b"prompt=a ball",
            headers={"Content-Type": "text/plain"},
        ),
        415,
        "unsupported_media_type",
        "Content-Type",
    )
    check_error(
        http.get("/v1/videos/" + UNKNOWN_ID), 404, "video_not_found", "video_id"
    )
    check_error(
        http.get("/v1/videos/not-a-video-id"), 404, "video_not_found", "video_id"
    )


def test_openai_routes_not_served_here_are_404_or_405(http) -> None:
    """Remix, edits, extensions and characters (the SDK has them) are not part of
    diffserve's contract."""
    check_error(
        http.post(f"/v1/videos/{UNKNOWN_ID}/remix", json={"prompt": "again"}),
        404,
        "not_found",
    )
    check_error(http.get("/v1/videos/characters/char_1"), 404, "not_found")
    for path in ("/v1/videos/edits", "/v1/videos/extensions", "/v1/videos/characters"):
        answer = http.post(path, json={"prompt": "again"})
        check_error(answer, 405, "method_not_allowed")
        assert answer.headers["allow"] == "DELETE, GET"
    assert http.put("/v1/videos", json={}).headers["allow"] == "GET, POST"


def test_every_videos_route_needs_the_key(server) -> None:
    for method, path in [
        ("POST", "/v1/videos"),
        ("GET", "/v1/videos"),
        ("GET", "/v1/videos/" + UNKNOWN_ID),
        ("DELETE", "/v1/videos/" + UNKNOWN_ID),
        ("GET", f"/v1/videos/{UNKNOWN_ID}/content"),
    ]:
        answer = httpx.request(
            method, server.url + path, timeout=10, json={} if method == "POST" else None
        )
        assert (
            answer.status_code == 401
            and answer.json()["error"]["code"] == "missing_api_key"
        ), answer.text


def test_the_openai_sdk_still_drives_it(server) -> None:
    """The SDK (a client users have, its videos resource deprecated with OpenAI's API)
    end to end, cheaply."""
    client = openai.OpenAI(
        base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60
    )
    video = client.videos.create(
        model=TOY,
        prompt="a ball",
        seconds="1",
        size="64x48",
        extra_body={"num_inference_steps": 1, "fps": 4, "seed": 3},
    )
    assert (video.status, video.seconds, video.size) == ("queued", "1", "64x48")
    while video.status in ("queued", "in_progress"):
        time.sleep(0.05)
        video = client.videos.retrieve(video.id)
    assert (
        video.status == "completed"
        and video.model_extra["diffserve"]["num_frames"] == 5
    ), video
    frames, _, _ = decode_mp4(client.videos.download_content(video.id).read())
    assert frames.shape == (5, 48, 64, 3)
    assert video.id in [v.id for v in client.videos.list(limit=5)]
    assert client.videos.delete(video.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)


def test_the_playground_video_tab_polls_and_plays_the_mp4(server, tmp_path) -> None:
    """The playground in headless Chromium: on a video model's server the Video tab
    replaces the image form; a job's progress comes from polling, and the finished MP4
    plays in the page at the requested size."""
    from chromium_session import find_browser, start_chromium
    from selenium.webdriver.support.ui import WebDriverWait

    found = find_browser()
    if isinstance(found, str):
        pytest.skip(f"no browser for the playground test: {found}")
    driver = start_chromium(
        *found, profile_dir=tmp_path / "profile", log_path=tmp_path / "chromedriver.log"
    )

    def wait_for(condition, message: str = "", timeout: float = 120.0):
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(
            condition, message
        )

    def text(element_id: str) -> str:
        return driver.find_element("id", element_id).text

    try:
        driver.get(server.url + "/")
        wait_for(lambda d: d.find_element("id", "key-panel").is_displayed())
        driver.find_element("id", "api-key").send_keys(API_KEY + "\n")
        wait_for(
            lambda d: d.find_element("id", "video-panel").is_displayed(), "no video tab"
        )
        assert not driver.find_element("id", "generate-panel").is_displayed()
        for element_id, value in {
            "video-prompt": "a red ball rolling left",
            "video-width": "64",
            "video-height": "48",
            "video-frames": "9",
            "video-fps": "8",
            "video-steps": "12",
            "video-seed": "5",
        }.items():
            field = driver.find_element("id", element_id)
            field.clear()
            field.send_keys(value)
        driver.execute_script("""window.seen = [];
            const text = document.getElementById('video-progress-text');
            new MutationObserver(() => window.seen.push(text.textContent)).observe(
                text, {childList: true, characterData: true, subtree: true});""")
        driver.find_element("id", "video-generate").click()
        wait_for(
            lambda _: text("video-status").startswith("Done"),
            text("video-error") or text("video-status"),
        )
        assert "9 frames at 8 fps, seed 5" in text("video-status")
        seen = driver.execute_script("return window.seen")
        assert (
            any(s.startswith("in_progress") for s in seen)
            and seen[-1] == "completed · 100%"
        ), seen
        size = wait_for(
            lambda d: d.execute_script(
                "const v = document.getElementById('video-result'); "
                "return v.readyState >= 1 && v.videoWidth ? [v.videoWidth, "
                "v.videoHeight, v.duration] : null"
            ),
            "the MP4 did not load in the page",
        )
        assert size[:2] == [64, 48] and size[2] == pytest.approx(9 / 8, abs=0.2), size
        severe = [
            e
            for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "401" not in e["message"]
        ]
        assert not severe, severe
    finally:
        driver.quit()
