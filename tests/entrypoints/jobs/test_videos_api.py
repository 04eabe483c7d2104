"""``/v1/videos`` on a real ``diffserve serve`` of the trained toy video model (toy-motion, a tiny Wan2.1), through
the real ``openai`` SDK: create, poll to ``completed`` (``in_progress`` seen), download the MP4 (the frames and size
asked for, read back by the toy-motion checker: the video shows its prompt), the thumbnail (the first frame) and the
sprite sheet; list, delete; bad input answered 400 naming the field while the server serves on;
``Idempotency-Key``; the API key guarding every route."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from diffserve.entrypoints.video_encoding import read_mp4
from diffserve.zoo.toy_motion.checker import read_clip
from diffserve.zoo.toy_motion.grammar import parse_prompt

API_KEY = "video-key"
SIZE = "64x48"
FAST = {"num_inference_steps": 2, "fps": 8, "seed": 3}


@pytest.fixture(scope="module")
def server(server_launcher, write_deploy, tmp_path_factory):
    from diffserve.zoo.wan import toy_motion_dir

    state = tmp_path_factory.mktemp("state")
    deploy = write_deploy("dtype: float32\nenforce_eager: true\nwarmup:\n  enabled: false\n")
    with server_launcher(toy_motion_dir(), "--deploy-config", deploy, "--api-key", API_KEY, "--state-dir", state,
                         "--served-model-name", "toy-motion") as proc:
        proc.state_dir = state
        yield proc


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


def wait(client: openai.OpenAI, video_id: str, timeout: float = 120.0) -> tuple[Any, list[str]]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = client.videos.retrieve(video_id)
        if not seen or seen[-1] != video.status:
            seen.append(video.status)
        if video.status in ("completed", "failed"):
            return video, seen
        time.sleep(0.02)
    raise TimeoutError(f"{video_id} still {seen[-1]} after {timeout} s")


def test_the_sdk_creates_polls_and_downloads_a_video(client: openai.OpenAI, server) -> None:
    prompt = "a yellow square moving right on a black background"
    video = client.videos.create(model="toy-motion", prompt=prompt, seconds="2", size="64x64",
                                 extra_body={**FAST, "num_inference_steps": 24})
    assert video.object == "video" and video.status == "queued" and video.progress == 0
    assert video.id.startswith("video_") and len(video.id) == len("video_") + 32
    assert video.size == "64x64" and video.seconds == "2" and video.model == "toy-motion"
    done, seen = wait(client, video.id)
    assert done.status == "completed", done.error
    assert "in_progress" in seen, seen
    assert done.progress == 100 and done.completed_at >= done.created_at and done.error is None
    assert done.expires_at == pytest.approx(done.completed_at + 86400, abs=2)
    extra = done.model_extra["diffserve"]
    assert extra["seed"] == 3 and extra["num_frames"] == 17 and extra["fps"] == 8  # 2 s at 8 fps: 4k+1 = 17
    assert extra["attestation"]["linear"] and extra["config_fingerprint"]

    frames, tags, fps = read_mp4(client.videos.download_content(video.id).read())
    assert frames.shape == (17, 64, 64, 3) and fps == 8 and tags["seed"] == "3"
    # What the MP4 shows, through H.264: the prompt's background, object colour and direction (shape is the
    # statistical test's, tests/zoo/test_toy_motion_model.py: one clip may miss it).
    asked, read = parse_prompt(prompt), read_clip(list(frames)).scene
    assert (read.background, read.colour, read.direction) == (asked.background, asked.colour, asked.direction), read
    thumbnail = np.asarray(Image.open(io.BytesIO(client.videos.download_content(video.id,
                                                                                variant="thumbnail").read())))
    assert thumbnail.shape == (64, 64, 3)
    # The thumbnail is the first frame losslessly; the MP4's first frame is it through H.264.
    assert np.abs(thumbnail.astype(int) - frames[0].astype(int)).mean() < 6
    sheet = Image.open(io.BytesIO(client.videos.download_content(video.id, variant="spritesheet").read()))
    assert sheet.format == "JPEG" and sheet.size == (4 * 64, 4 * 64)  # 16 of the 17 frames, 4 columns

    listed = client.videos.list(limit=100)
    assert video.id in [v.id for v in listed.data]
    assert client.videos.delete(video.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)
    with pytest.raises(openai.NotFoundError):
        client.videos.download_content(video.id)
    assert not any(server.state_dir.glob(f"videos/{video.id}*"))


def test_json_body_with_a_first_frame_and_idempotency(server) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": "job-42"}
    png = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(png, format="PNG")
    body = {"prompt": "a ball", "num_frames": 5, "size": SIZE, **FAST,
            "input_reference": {"image_url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()}}
    first = httpx.post(server.url + "/v1/videos", json=body, headers=headers, timeout=30)
    # The tiny Wan is text-to-video: a first frame is refused naming the field, and nothing is stored.
    assert first.status_code == 400 and first.json()["error"]["param"] == "image", first.text
    del body["input_reference"]
    first = httpx.post(server.url + "/v1/videos", json=body, headers=headers, timeout=30)
    again = httpx.post(server.url + "/v1/videos", json=body, headers=headers, timeout=30)
    assert first.status_code == again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    other = httpx.post(server.url + "/v1/videos", json={**body, "seed": 4}, headers=headers, timeout=30)
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_conflict"


@pytest.mark.parametrize(("fields", "param"), [
    ({"seconds": "-1"}, "seconds"),
    ({"seconds": "four"}, "seconds"),
    ({"size": "60x48"}, "size"),
    ({"num_frames": 8}, "num_frames"),
    ({"resolution": "hd"}, "resolution"),
    ({"seed": "x"}, "seed"),
])
def test_bad_input_is_400_naming_the_field(server, fields: dict[str, Any], param: str) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    data = {"prompt": "a ball", "size": SIZE, "num_frames": "5", **{k: str(v) for k, v in fields.items()}}
    answer = httpx.post(server.url + "/v1/videos", headers=headers, timeout=30,  # multipart, as the SDK sends
                        files=[(name, (None, value)) for name, value in data.items()])
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param, answer.text
    assert httpx.get(server.url + "/ready", timeout=10).status_code == 200


def test_an_oversized_input_reference_is_refused(server) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    big = io.BytesIO()
    Image.new("RGB", (4096, 4096)).save(big, format="PNG")
    answer = httpx.post(server.url + "/v1/videos", data={"prompt": "a ball"}, headers=headers, timeout=30,
                        files={"input_reference": ("big.png", big.getvalue(), "image/png")})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input_reference", answer.text


def test_every_videos_route_needs_the_key(server) -> None:
    for method, path in [("POST", "/v1/videos"), ("GET", "/v1/videos"), ("GET", "/v1/videos/video_" + "0" * 32),
                         ("DELETE", "/v1/videos/video_" + "0" * 32), ("GET", f"/v1/videos/video_{'0' * 32}/content")]:
        answer = httpx.request(method, server.url + path, timeout=10, json={} if method == "POST" else None)
        assert answer.status_code == 401, (method, path, answer.text)
    missing = httpx.get(server.url + "/v1/videos/video_" + "0" * 32, timeout=10,
                        headers={"Authorization": f"Bearer {API_KEY}"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "video_not_found"


def test_the_playground_video_tab_polls_and_plays_the_mp4(server, tmp_path) -> None:
    """The playground in headless Chromium: on a video model's server the Video tab replaces the image form; a
    job's progress comes from polling, and the finished MP4 plays in the page at the requested size."""
    from chromium_session import find_browser, start_chromium
    from selenium.webdriver.support.ui import WebDriverWait

    found = find_browser()
    if isinstance(found, str):
        pytest.skip(f"no browser for the playground test: {found}")
    driver = start_chromium(*found, profile_dir=tmp_path / "profile", log_path=tmp_path / "chromedriver.log")

    def wait_for(condition, message: str = "", timeout: float = 120.0):
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition, message)

    def text(element_id: str) -> str:
        return driver.find_element("id", element_id).text

    try:
        driver.get(server.url + "/")
        wait_for(lambda d: d.find_element("id", "key-panel").is_displayed())
        driver.find_element("id", "api-key").send_keys(API_KEY + "\n")
        wait_for(lambda d: d.find_element("id", "video-panel").is_displayed(), "no video tab")
        assert not driver.find_element("id", "generate-panel").is_displayed()
        for element_id, value in {"video-prompt": "a red ball rolling left", "video-width": "64",
                                  "video-height": "48", "video-frames": "9", "video-fps": "8",
                                  "video-steps": "12", "video-seed": "5"}.items():
            field = driver.find_element("id", element_id)
            field.clear()
            field.send_keys(value)
        driver.execute_script("""window.seen = []; new MutationObserver(() => window.seen.push(
            document.getElementById('video-progress-text').textContent)).observe(
            document.getElementById('video-progress-text'), {childList: true, characterData: true, subtree: true});""")
        driver.find_element("id", "video-generate").click()
        wait_for(lambda _: text("video-status").startswith("Done"), text("video-error") or text("video-status"))
        assert "9 frames at 8 fps, seed 5" in text("video-status")
        seen = driver.execute_script("return window.seen")
        assert any(s.startswith("in_progress") for s in seen) and seen[-1] == "completed · 100%", seen
        size = wait_for(lambda d: d.execute_script(
            "const v = document.getElementById('video-result'); "
            "return v.readyState >= 1 && v.videoWidth ? [v.videoWidth, v.videoHeight, v.duration] : null"),
            "the MP4 did not load in the page")
        assert size[:2] == [64, 48] and size[2] == pytest.approx(9 / 8, abs=0.2), size
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "401" not in e["message"]]
        assert not severe, severe
    finally:
        driver.quit()
