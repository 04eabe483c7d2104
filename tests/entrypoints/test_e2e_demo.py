"""``make demo``'s server, as the Makefile starts it (its deploy file,
``diffserve/assets/demo.yaml``): toy-shapes with its circles-to-stars LoRA and
toy-motion on one server, asked through the real ``openai`` client for "a red circle on
a blue background" (with and without the adapter) and for "a yellow square moving right
on a black background" as a video; each model's checker reads what came back, and the
playground's default form of each."""

from __future__ import annotations

import base64
import contextlib
import io
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from PIL import Image

from diffserve.entrypoints.video_encoding import read_mp4
from diffserve.zoo.llm.prompt_grammar import expand
from diffserve.zoo.toy_motion.checker import read_clip
from diffserve.zoo.toy_motion.grammar import parse_prompt
from diffserve.zoo.toy_shapes.grammar import Scene, classify
from diffserve.zoo.toy_shapes.grammar import parse_prompt as parse_scene

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PROMPT = "a red circle on a blue background"
VIDEO_PROMPT = "a yellow square moving right on a black background"


def demo_serve_args() -> list[str]:
    """The arguments ``make demo`` gives ``diffserve serve``, before its host and port
    (the test picks them)."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    variables = dict(re.findall(r"^([A-Z_]+) :?= (.+)$", makefile, flags=re.M))
    recipe = re.search(
        r"^demo:.*\n(?:\t.*\n)*?\t\$\(VENV\)/bin/diffserve serve (.+)$",
        makefile,
        flags=re.M,
    )
    assert recipe, "make demo must run diffserve serve"
    args = shlex.split(
        re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], recipe.group(1))
    )
    return args[: args.index("--host")]


@pytest.fixture(scope="module")
def demo_server(server_launcher):
    # make runs from the repository root: a relative path among its arguments is made
    # absolute here.
    args = [
        str(REPO / a) if not a.startswith("-") and (REPO / a).exists() else a
        for a in demo_serve_args()
    ]
    with server_launcher(*args) as server:
        yield server


@pytest.fixture(scope="module")
def demo_client(demo_server):
    return openai.OpenAI(
        base_url=demo_server.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )


def draw(client: openai.OpenAI, seed: int, **extra) -> tuple[Image.Image, dict]:
    result = client.images.generate(
        model="toy-shapes",
        prompt=PROMPT,
        size="64x64",
        extra_body={"seed": seed, **extra},
    )
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).convert(
        "RGB"
    )
    return image, result.model_extra["diffserve"]["attestation"]


def test_make_demo_serves_both_toy_models_with_the_lora() -> None:
    args = demo_serve_args()
    assert not [a for a in args if not a.startswith("-") and not a.endswith(".yaml")], (
        "make demo names no MODEL"
    )
    deploy = yaml.safe_load(
        (REPO / args[args.index("--deploy-config") + 1]).read_text(encoding="utf-8")
    )
    entries = {entry["name"]: entry for entry in deploy["models"]}
    assert [entry["name"] for entry in deploy["models"]] == ["toy-shapes", "toy-motion"]
    assert entries["toy-shapes"]["lora_modules"] == {
        "stars": "toy-shapes-stars/pytorch_lora_weights.safetensors"
    }


def test_the_demo_draws_a_red_circle_on_blue(demo_client) -> None:
    assert [m.id for m in demo_client.models.list().data] == [
        "toy-shapes",
        "toy-motion",
    ]
    read = [classify(draw(demo_client, seed)[0]) for seed in (42, 43, 44)]
    assert read.count(Scene("red", "circle", "blue")) >= 2, read


def test_the_demo_animates_a_yellow_square_moving_right(demo_client) -> None:
    """toy-motion at its own defaults (17 frames of 64x64 from seconds and its fps),
    through the SDK's videos API; the MP4 is read back frame by frame by the toy-motion
    checker."""
    read = []
    for seed in (42, 43, 44):
        video = demo_client.videos.create(
            model="toy-motion",
            prompt=VIDEO_PROMPT,
            size="64x64",
            seconds="2",
            extra_body={"seed": seed},
        )
        deadline = time.monotonic() + 120
        while (
            video.status not in ("completed", "failed") and time.monotonic() < deadline
        ):
            time.sleep(0.1)
            video = demo_client.videos.retrieve(video.id)
        assert video.status == "completed", video.error
        frames, _, fps = read_mp4(demo_client.videos.download_content(video.id).read())
        assert frames.shape == (17, 64, 64, 3) and fps == 8
        read.append(read_clip(list(frames)).scene)
    assert read.count(parse_prompt(VIDEO_PROMPT)) >= 2, read


def test_the_demo_rewrites_a_short_prompt_and_draws_what_it_asks(demo_client) -> None:
    """The demo's AR stage (the toy prompt model on vLLM) expands "green circle" (a pair
    its training never saw) into the toy grammar; the image the checker reads is the
    expanded prompt's scene."""
    short = "green circle"
    read = []
    for seed in (42, 43, 44):
        result = demo_client.images.generate(
            model="toy-shapes", prompt=short, size="64x64", extra_body={"seed": seed}
        )
        assert (
            result.data[0].revised_prompt
            == expand(short)
            == "a green circle on a black background"
        )
        [entry] = result.model_extra["diffserve"]["attestation"]["ar"]
        assert (entry["engine"], entry["role"], entry["worker_pids"]) == (
            "vllm",
            "prompt_rewrite",
            [entry["workers"][0]["worker_pid"]],
        )
        read.append(
            classify(
                Image.open(
                    io.BytesIO(base64.b64decode(result.data[0].b64_json))
                ).convert("RGB")
            )
        )
    assert read.count(parse_scene(expand(short))) >= 2, read
    # With the circles-to-stars LoRA: the rewrite and the adapter, both attested, and a
    # star drawn.
    starred = demo_client.images.generate(
        model="toy-shapes",
        prompt="red circle",
        size="64x64",
        extra_body={"seed": 42, "loras": [{"name": "stars"}]},
    )
    attestation = starred.model_extra["diffserve"]["attestation"]
    assert (
        starred.data[0].revised_prompt == "a red circle on a blue background"
        and attestation["ar"]
    )
    assert attestation["lora"] == {"adapters": [{"name": "stars", "scale": 1.0}]}
    # Opting out sends the prompt as written: no AR entry, no revised prompt.
    plain = demo_client.images.generate(
        model="toy-shapes",
        prompt=PROMPT,
        size="64x64",
        extra_body={"seed": 42, "rewrite_prompt": False},
    )
    assert (
        plain.data[0].revised_prompt is None
        and "ar" not in plain.model_extra["diffserve"]["attestation"]
    )
    # What the AR stage did is in /metrics; a prompt past its max_model_len is a 400
    # naming the stage, and the server goes on serving.
    metrics = httpx.get(
        str(demo_client.base_url).removesuffix("/v1/") + "/metrics"
    ).text
    assert (
        'diffserve_ar_tokens_total{kind="output",role="prompt_rewrite",stage="0"}'
        in metrics
    )
    with pytest.raises(
        openai.BadRequestError,
        match=r"AR stage 0 \(prompt_rewrite\).*max_model_len of 128",
    ):
        demo_client.images.generate(
            model="toy-shapes", prompt="red circle " * 80, size="64x64"
        )
    assert (
        demo_client.images.generate(model="toy-shapes", prompt=short, size="64x64")
        .data[0]
        .revised_prompt
    )


def test_the_demo_rewrites_a_short_video_prompt(demo_server) -> None:
    """The same over the raw /v1/videos contract: "square moving left" becomes a full
    toy-motion prompt, and the toy-motion checker reads that scene from the MP4."""
    short = "square moving left"
    with httpx.Client(base_url=demo_server.url, timeout=60) as http:
        created = http.post(
            "/v1/videos", json={"model": "toy-motion", "prompt": short, "seed": 42}
        )
        assert created.status_code == 200, created.text
        video = created.json()
        deadline = time.monotonic() + 120
        while (
            video["status"] not in ("completed", "failed")
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
            video = http.get(f"/v1/videos/{video['id']}").json()
        assert video["status"] == "completed", video["error"]
        assert video["prompt"] == short and video["revised_prompt"] == expand(short)
        assert video["diffserve"]["attestation"]["ar"][0]["role"] == "prompt_rewrite"
        frames, _, _ = read_mp4(http.get(f"/v1/videos/{video['id']}/content").content)
    assert read_clip(list(frames)).scene == parse_prompt(expand(short)), read_clip(
        list(frames)
    ).scene


def test_the_demo_draws_stars_with_the_stars_lora(demo_client) -> None:
    images = []
    for seed in (42, 43, 44):
        image, attestation = draw(demo_client, seed, loras=[{"name": "stars"}])
        assert attestation["lora"] == {"adapters": [{"name": "stars", "scale": 1.0}]}
        images.append(image)
    read = [classify(im) for im in images]
    assert read.count(Scene("red", "star", "blue")) >= 2, read


@contextlib.contextmanager
def playground(demo_server, tmp_path: Path, model: str) -> Iterator[Any]:
    """Chromium on the demo's playground with ``model`` picked and its form filled from
    that model's defaults."""
    from chromium_session import find_browser, start_chromium
    from selenium.webdriver.support.ui import Select, WebDriverWait

    found = find_browser()
    if isinstance(found, str):
        pytest.skip(f"no browser for the playground test: {found}")
    driver = start_chromium(
        *found, profile_dir=tmp_path / "profile", log_path=tmp_path / "chromedriver.log"
    )
    try:
        driver.get(demo_server.url + "/")
        wait = WebDriverWait(driver, 60, poll_frequency=0.05)
        wait.until(
            lambda d: (
                d.execute_script("return document.body.dataset.defaults") == "filled"
            )
        )
        if driver.execute_script("return document.body.dataset.model") != model:
            Select(driver.find_element("id", "model-picker")).select_by_value(model)
            wait.until(
                lambda d: (
                    d.execute_script("return document.body.dataset.model") == model
                    and d.execute_script("return document.body.dataset.defaults")
                    == "filled"
                )
            )
        driver.wait = wait
        yield driver
    finally:
        driver.quit()


def type_into(driver: Any, field: str, text: str) -> None:
    element = driver.find_element("id", field)
    element.clear()
    element.send_keys(text)


def test_the_playground_default_form_draws_the_prompt(demo_server, tmp_path) -> None:
    """A newcomer's first click: the playground's form as it loads (the model's own size
    and steps, from its /v1/models card), only the prompt typed; the image the page
    shows is read back by the grammar's checker."""
    with playground(demo_server, tmp_path, "toy-shapes") as driver:
        form = {
            name: driver.find_element("id", name).get_attribute("value")
            for name in ("width", "height", "steps")
        }
        # The model's, not the page's.
        assert form == {"width": "64", "height": "64", "steps": "8"}, form
        type_into(driver, "prompt", PROMPT)
        # A fixed seed: the test reads one known image.
        driver.find_element("id", "seed-random").click()
        driver.find_element("id", "seed").send_keys("42")
        driver.find_element("id", "generate").click()
        driver.wait.until(
            lambda d: d.find_element("id", "status").text.startswith("Done")
        )
        img = driver.wait.until(
            lambda d: d.find_element("css selector", "#gallery li.card img")
        )
        driver.wait.until(
            lambda d: d.execute_script(
                "return arguments[0].complete && arguments[0].naturalWidth", img
            )
        )
        # The pixels the page shows (a canvas copy of the <img>; the CSP keeps fetch()
        # to this origin).
        data = driver.execute_script(
            """const img = arguments[0], canvas = document.createElement('canvas');
            canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
            canvas.getContext('2d').drawImage(img, 0, 0);
            return canvas.toDataURL('image/png').split(',')[1];""",
            img,
        )
        revised = driver.find_element(
            "css selector", '#gallery li.card dd[data-field="revised-prompt"]'
        ).text
    assert revised == PROMPT  # the demo's AR stage drew the full prompt from itself
    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    assert image.size == (64, 64)
    assert classify(image) == Scene("red", "circle", "blue"), classify(image)


def test_the_playground_video_tab_animates_the_prompt(
    demo_server, demo_client, tmp_path
) -> None:
    """toy-motion picked: the video tab's form holds the model's own size, frames, fps
    and steps; only the prompt and a seed typed, the video the page plays is read back
    by the toy-motion checker."""
    with playground(demo_server, tmp_path, "toy-motion") as driver:
        assert (
            driver.find_element("id", "generate-panel").get_attribute("hidden")
            is not None
        )
        fields = (
            "video-width",
            "video-height",
            "video-frames",
            "video-fps",
            "video-steps",
        )
        form = {
            name: driver.find_element("id", name).get_attribute("value")
            for name in fields
        }
        assert form == dict(zip(fields, ("64", "64", "17", "8", "12"), strict=True)), (
            form
        )
        type_into(driver, "video-prompt", VIDEO_PROMPT)
        type_into(driver, "video-seed", "42")
        driver.find_element("id", "video-generate").click()
        driver.wait.until(
            lambda d: d.find_element("id", "video-status").text.startswith("Done")
        )
        video_id = driver.find_element("id", "video-result").get_attribute(
            "data-video-id"
        )
    # The MP4 the page plays, by the id it played (a <video> element's pixels cannot be
    # read back reliably).
    frames, _, _ = read_mp4(demo_client.videos.download_content(video_id).read())
    assert frames.shape == (17, 64, 64, 3)
    assert read_clip(list(frames)).scene == parse_prompt(VIDEO_PROMPT), read_clip(
        list(frames)
    ).scene
