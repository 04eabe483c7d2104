"""``make demo``'s server, as the Makefile starts it: the toy-shapes model (no MODEL) with its circles-to-stars
LoRA, asked through the real ``openai`` client for "a red circle on a blue background", with and without
the adapter; the grammar's checker reads what came back."""

from __future__ import annotations

import base64
import io
import re
import shlex
from pathlib import Path

import openai
import pytest
from PIL import Image

from diffserve.zoo.toy_shapes.grammar import Scene, classify

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
PROMPT = "a red circle on a blue background"


def demo_serve_args() -> list[str]:
    """The arguments ``make demo`` gives ``diffserve serve``, before its host and port (the test picks them)."""
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    variables = dict(re.findall(r"^([A-Z_]+) :?= (.+)$", makefile, flags=re.M))
    recipe = re.search(r"^demo:.*\n(?:\t.*\n)*?\t\$\(VENV\)/bin/diffserve serve (.+)$", makefile, flags=re.M)
    assert recipe, "make demo must run diffserve serve"
    args = shlex.split(re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], recipe.group(1)))
    return args[:args.index("--host")]


@pytest.fixture(scope="module")
def demo_server(server_launcher):
    # make runs from the repository root: its relative adapter path (name=path) is made absolute here.
    args = [re.sub(r"^(\w+)=(?!/)", lambda m: f"{m.group(1)}={REPO}/", a) for a in demo_serve_args()]
    with server_launcher(*args) as server:
        yield server


@pytest.fixture(scope="module")
def demo_client(demo_server):
    return openai.OpenAI(base_url=demo_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def draw(client: openai.OpenAI, seed: int, **extra) -> tuple[Image.Image, dict]:
    result = client.images.generate(model="toy-shapes", prompt=PROMPT, size="64x64",
                                    extra_body={"seed": seed, **extra})
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).convert("RGB")
    return image, result.model_extra["diffserve"]["attestation"]


def test_make_demo_serves_the_toy_model_with_its_lora() -> None:
    args = demo_serve_args()
    assert "--lora" in args and args[args.index("--lora") + 1].startswith("stars=")
    assert not [a for a in args if not a.startswith("-") and "=" not in a], "make demo names no MODEL"


def test_the_demo_draws_a_red_circle_on_blue(demo_client) -> None:
    assert [m.id for m in demo_client.models.list().data] == ["toy-shapes"]
    read = [classify(draw(demo_client, seed)[0]) for seed in (42, 43, 44)]
    assert read.count(Scene("red", "circle", "blue")) >= 2, read


def test_the_demo_draws_stars_with_the_stars_lora(demo_client) -> None:
    images = []
    for seed in (42, 43, 44):
        image, attestation = draw(demo_client, seed, loras=[{"name": "stars"}])
        assert attestation["lora"] == {"adapters": [{"name": "stars", "scale": 1.0}]}
        images.append(image)
    read = [classify(im) for im in images]
    assert read.count(Scene("red", "star", "blue")) >= 2, read


def test_the_playground_default_form_draws_the_prompt(demo_server, tmp_path) -> None:
    """A newcomer's first click: the playground's form as it loads (the model's own size and steps, from its
    /v1/models card), only the prompt typed; the image the page shows is read back by the grammar's checker."""
    from chromium_session import find_browser, start_chromium
    from selenium.webdriver.support.ui import WebDriverWait

    found = find_browser()
    if isinstance(found, str):
        pytest.skip(f"no browser for the playground test: {found}")
    driver = start_chromium(*found, profile_dir=tmp_path / "profile", log_path=tmp_path / "chromedriver.log")
    try:
        driver.get(demo_server.url + "/")
        wait = WebDriverWait(driver, 60, poll_frequency=0.05)
        wait.until(lambda d: d.execute_script("return document.body.dataset.defaults") == "filled")
        form = {name: driver.find_element("id", name).get_attribute("value") for name in ("width", "height", "steps")}
        assert form == {"width": "64", "height": "64", "steps": "8"}, form  # the model's, not the page's
        prompt = driver.find_element("id", "prompt")
        prompt.clear()
        prompt.send_keys(PROMPT)
        driver.find_element("id", "seed-random").click()  # a fixed seed: the test reads one known image
        driver.find_element("id", "seed").send_keys("42")
        driver.find_element("id", "generate").click()
        wait.until(lambda d: d.find_element("id", "status").text.startswith("Done"))
        img = wait.until(lambda d: d.find_element("css selector", "#gallery li.card img"))
        wait.until(lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img))
        # The pixels the page shows (a canvas copy of the <img>; the CSP keeps fetch() to this origin).
        data = driver.execute_script("""const img = arguments[0], canvas = document.createElement('canvas');
            canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
            canvas.getContext('2d').drawImage(img, 0, 0);
            return canvas.toDataURL('image/png').split(',')[1];""", img)
    finally:
        driver.quit()
    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    assert image.size == (64, 64)
    assert classify(image) == Scene("red", "circle", "blue"), classify(image)
