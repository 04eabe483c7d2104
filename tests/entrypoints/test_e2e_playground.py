"""The web playground at ``/``, in a real headless Chromium against a real ``diffserve
serve``.

The server is the shared ``uni_server`` (tiny FLUX, an API key, ``max_steps: 1000``).
The browser is the system's Chromium driven by Selenium through its chromedriver
(``chromium_session.py``); without one the browser tests skip and say how to install it.
The tests share one page, as a user would, in file order. The example-prompt tests at
the end start a server of two models that declare examples, with a page of their own.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
from chromium_session import find_browser, start_chromium
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

GEN = "/v1/images/generations"
ASSETS = {
    "/": "text/html",
    "/static/playground.css": "text/css",
    "/static/playground.js": "text/javascript",
    "/static/playground-stream.js": "text/javascript",
    "/static/playground-video.js": "text/javascript",
    "/static/playground-defaults.js": "text/javascript",
    "/static/playground-models.js": "text/javascript",
    "/static/favicon.svg": "image/svg+xml",
}

# WCAG contrast of each visible text element against the first opaque background behind
# it.
CONTRAST_JS = """
const lum = (c) => {
  const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map((v) => {
    v = Number(v) / 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
};
const bg = (el) => {
  for (; el; el = el.parentElement) {
    const c = getComputedStyle(el).backgroundColor;
    const m = c.match(/[\\d.]+/g);
    if (m && (m.length < 4 || Number(m[3]) > 0)) return c;
  }
  return "rgb(255, 255, 255)";
};
return Array.from(document.querySelectorAll(arguments[0]))
  .filter((e) => e.offsetParent !== null && (e.textContent.trim() || e.value))
  .map((e) => { const a = lum(getComputedStyle(e).color), b = lum(bg(e));
    return [e.id || e.tagName + ':' + e.textContent.trim().slice(0, 20),
            (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)]; });
"""


@pytest.fixture(scope="module")
def server(uni_server):
    return uni_server


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    """The playground loaded in headless Chromium; downloads land in
    ``page.downloads``."""
    found = find_browser()
    if isinstance(found, str):
        pytest.skip(f"no browser for the playground test: {found}")
    work = tmp_path_factory.mktemp("chromium")
    driver = start_chromium(
        *found, profile_dir=work / "profile", log_path=work / "chromedriver.log"
    )
    downloads = work / "downloads"
    downloads.mkdir()
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior",
        {"behavior": "allow", "downloadPath": str(downloads)},
    )
    driver.downloads = downloads
    try:
        driver.get(server.url + "/")
        yield driver
    finally:
        driver.quit()


def by_id(driver, element_id: str):
    return driver.find_element("id", element_id)


def wait(driver, condition, timeout: float = 60.0, message: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition, message)


def fill(driver, **fields: str) -> None:
    for element_id, value in fields.items():
        element = by_id(driver, element_id)
        element.clear()
        element.send_keys(value)


def text(driver, element_id: str) -> str:
    return by_id(driver, element_id).text


def unlock(page, server) -> None:
    """The key entered, as a user does once per tab (for a test run on its own)."""
    if not page.execute_script("return sessionStorage.getItem('diffserve.apiKey')"):
        wait(page, lambda d: by_id(d, "key-panel").is_displayed())
        by_id(page, "api-key").send_keys(server.api_key + "\n")
    wait(
        page,
        lambda d: text(d, "server-line") == f"Model: {server.model}",
        message=text(page, "server-line"),
    )


def scrape(server) -> dict[tuple[str, tuple], float]:
    resp = httpx.get(server.url + "/metrics")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_page_is_public_self_contained_and_locked_down(server) -> None:
    for path, media_type in ASSETS.items():
        resp = httpx.get(server.url + path)  # no key: the page asks for it itself
        assert resp.status_code == 200, (path, resp.text)
        assert resp.headers["content-type"].startswith(media_type)
        csp = resp.headers["content-security-policy"]
        assert (
            "default-src 'self'" in csp
            and "script-src 'self'" in csp
            and "connect-src 'self'" in csp
        )
        assert resp.headers["x-content-type-options"] == "nosniff"
        # Offline and CDN-free: nothing is loaded from another origin.
        assert not re.search(
            r"(src|href)=[\"']?(https?:)?//|@import|url\(\s*['\"]?(https?:)?//",
            resp.text,
        ), path
    # The API itself still needs the key.
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.post(server.url + "/", json={}).status_code == 405
    assert httpx.get(server.url + "/static/../v1/config").status_code == 401


def test_key_is_asked_for_and_kept_in_session_storage_only(page, server) -> None:
    wait(
        page,
        lambda d: by_id(d, "key-panel").is_displayed(),
        message="the page did not ask for the API key",
    )
    by_id(page, "api-key").send_keys("wrong-key\n")
    wait(
        page,
        lambda d: "missing or incorrect API key" in text(d, "key-error"),
        message=text(page, "key-error"),
    )
    by_id(page, "api-key").send_keys(server.api_key + "\n")
    wait(
        page,
        lambda d: text(d, "server-line") == f"Model: {server.model}",
        message=text(page, "server-line"),
    )
    assert not by_id(page, "key-panel").is_displayed()
    assert (
        page.execute_script("return sessionStorage.getItem('diffserve.apiKey')")
        == server.api_key
    )
    assert (
        page.execute_script("return localStorage.length + document.cookie.length") == 0
    )
    # tiny-flux (random weights) declares no example prompts: the prompt box holds the
    # page's neutral prompt.
    card = httpx.get(server.url + "/v1/models", headers=server.auth).json()["data"][0]
    assert card["diffserve"]["example_prompts"] == []
    prompt = by_id(page, "prompt").get_attribute("value")
    assert prompt == page.execute_script(
        "return document.getElementById('prompt').defaultValue"
    )
    assert prompt and "fox" not in prompt, prompt
    # The config panel: every key with its value, source and location (redacted to the
    # file's name).
    row = wait(
        page,
        lambda d: d.find_elements(
            "css selector", "#config tr[data-key='server.max_steps']"
        ),
    )[0]
    key, value, source, location = (
        c.text for c in row.find_elements("css selector", "th, td")
    )
    assert (key, value, source) == ("server.max_steps", "1000", "yaml")
    assert re.fullmatch(r".*deploy\.yaml:\d+", location), location
    assert page.find_elements("css selector", "#config tr[data-key='enforce_eager']")


def test_generate_shows_progress_images_and_proof(page, server, tmp_path) -> None:
    unlock(page, server)
    fill(page, prompt="a lighthouse at dusk", width="64", height="48", steps="3", n="2")
    assert (
        by_id(page, "seed-random").is_selected()
        and not by_id(page, "seed").is_enabled()
    )
    # Every text the element shows, from each mutation record (events that reach the
    # page in one chunk are shown in one task: one observer call, several records).
    page.execute_script("""window.seenSteps = [];
        const text = document.getElementById('progress-text');
        new MutationObserver(records => { for (const r of records) {
            for (const node of r.addedNodes) window.seenSteps.push(node.textContent);
            if (r.type === 'characterData') window.seenSteps.push(r.target.data);
        } }).observe(text, {childList: true, characterData: true, subtree: true});""")
    by_id(page, "generate").click()
    wait(
        page,
        lambda d: text(d, "status").startswith("Done"),
        message=text(page, "error") or text(page, "status"),
    )
    seen = page.execute_script("return window.seenSteps")
    assert [s for s in seen if s.startswith("step ")][:3] == [
        "step 1 / 3",
        "step 2 / 3",
        "step 3 / 3",
    ], seen
    assert page.execute_script(
        "const p = document.getElementById('progress'); return [p.value, p.max]"
    ) == [3, 3]
    cards = page.find_elements("css selector", "#gallery li.card")
    assert len(cards) == 2

    def field(card, name: str) -> str:
        return card.find_element("css selector", f"dd[data-field='{name}']").text

    seeds = [int(field(card, "seed")) for card in cards]
    assert seeds[1] == seeds[0] + 1  # image i uses seed + i
    for card, seed in zip(cards, seeds, strict=True):
        img = card.find_element("tag name", "img")
        wait(
            page,
            lambda d, img=img: d.execute_script("return arguments[0].complete", img),
        )
        assert page.execute_script(
            "return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img
        ) == [64, 48]
        assert field(card, "size") == "64x48" and field(card, "steps") == "3"
        assert re.fullmatch(r"(\w+ × \d+)(, \w+ × \d+)*", field(card, "linear")), field(
            card, "linear"
        )
        assert re.fullmatch(r"(\w+ × \d+)(, \w+ × \d+)*", field(card, "attention")), (
            field(card, "attention")
        )
        assert field(card, "executor") == "uni" and field(card, "replica") == "0"
        # Uni: the server process itself.
        assert field(card, "worker") == f"pid {server.proc.pid}, rank 0, cpu"
        assert re.fullmatch(r"[0-9a-f]{16}", field(card, "fingerprint"))
        assert "denoise" in field(card, "timings") and "total" in field(card, "timings")
        # The download link holds the response's own image: its PNG chunks carry the
        # server's seed.
        link = card.find_element("css selector", "a[download]")
        assert link.get_attribute("download") == f"diffserve-{seed}.png"
        link.click()
        path = page.downloads / f"diffserve-{seed}.png"
        wait(
            page,
            lambda _, path=path: path.is_file() and path.stat().st_size > 0,
            timeout=20,
            message=f"{path.name} was not downloaded",
        )
        with Image.open(path) as png:
            assert png.size == (64, 48)
            assert png.text["seed"] == str(seed), png.text
            assert png.text["prompt"] == "a lighthouse at dusk"
            assert png.text["config_fingerprint"] == field(card, "fingerprint")
    shot = tmp_path / "playground.png"
    assert page.save_screenshot(str(shot)) and shot.stat().st_size > 0
    severe = [
        e
        for e in page.get_log("browser")
        if e["level"] == "SEVERE" and "401" not in e["message"]
    ]
    # No script error, no CSP violation (the 401s are the wrong-key probe)
    assert not severe, severe


def test_partial_images_show_while_denoising_then_the_result(page, server) -> None:
    unlock(page, server)
    fill(page, prompt="a kite", width="64", height="48", steps="6", n="1", previews="2")
    # Every partial image the preview box shows, in order.
    page.execute_script("""window.seenPreviews = [];
        const img = document.getElementById('preview');
        new MutationObserver(() => window.seenPreviews.push(img.dataset.index))
            .observe(img, {attributes: true, attributeFilter: ['src']});""")
    before = len(page.find_elements("css selector", "#gallery li.card"))
    by_id(page, "generate").click()
    wait(
        page,
        lambda d: text(d, "status").startswith("Done"),
        message=text(page, "error") or text(page, "status"),
    )
    assert page.execute_script("return window.seenPreviews") == ["0", "1"]
    assert by_id(page, "preview").is_displayed()
    assert text(page, "preview-caption") == "partial image 2 of 2 (image 1)"
    cards = page.find_elements("css selector", "#gallery li.card")
    assert len(cards) == before + 1
    newest = cards[0].find_element("css selector", "dd[data-field='steps']").text
    assert newest == "6"
    fill(page, previews="0")


def test_api_errors_show_the_error_message(page, server) -> None:
    unlock(page, server)
    fill(page, width="64", height="48", steps="5000", n="1")
    by_id(page, "generate").send_keys("\n")  # the keyboard path
    expected = httpx.post(
        server.url + GEN,
        headers=server.auth,
        json={
            "prompt": "x",
            "size": "64x48",
            "num_inference_steps": 5000,
            "stream": True,
        },
    ).json()["error"]["message"]
    wait(page, lambda d: text(d, "error"), message="no error was shown")
    assert (
        text(page, "error") == expected
        and "above this server's limit of 1000" in expected
    )
    assert "Traceback" not in page.page_source
    assert by_id(page, "generate").is_enabled() and not by_id(page, "stop").is_enabled()


def test_an_uploaded_image_is_edited_at_its_own_size(page, server, tmp_path) -> None:
    """Choosing a file sends the form to /v1/images/edits: the result takes the image's
    size."""
    unlock(page, server)
    source = tmp_path / "in.png"
    Image.new("RGB", (80, 48), (20, 120, 220)).save(source)
    before = len(page.find_elements("css selector", "#gallery li.card"))
    fill(page, prompt="make it red", steps="2", n="1", strength="0.7")
    by_id(page, "edit-image").send_keys(str(source))
    by_id(page, "generate").click()
    wait(
        page,
        lambda d: text(d, "status").startswith("Done"),
        message=text(page, "error") or text(page, "status"),
    )
    card = page.find_elements("css selector", "#gallery li.card")[0]  # newest first
    assert len(page.find_elements("css selector", "#gallery li.card")) == before + 1
    img = card.find_element("tag name", "img")
    wait(page, lambda d: d.execute_script("return arguments[0].complete", img))
    assert page.execute_script(
        "return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img
    ) == [80, 48]
    # Back to text-to-image.
    page.execute_script("document.getElementById('edit-image').value = ''")
    fill(page, strength="")


def test_lora_field_reaches_the_api(page, server) -> None:
    """The LoRA field is sent as ``loras``; this server registers none, so the API's 400
    message is shown."""
    unlock(page, server)
    fill(page, width="64", height="48", steps="2", n="1", loras="ghost:0.5")
    by_id(page, "generate").click()
    wait(page, lambda d: text(d, "error"), message="no error was shown")
    assert "unknown LoRA adapter 'ghost'" in text(page, "error")
    fill(page, loras="")  # cleared for the tests after this one


def test_stop_aborts_the_request_on_the_server(page, server) -> None:
    unlock(page, server)
    before = scrape(server)
    cards = len(page.find_elements("css selector", "#gallery li.card"))
    fill(page, width="64", height="64", steps="1000", n="1")
    by_id(page, "generate").click()
    wait(
        page,
        lambda d: (
            d.execute_script("return document.getElementById('progress').value") >= 3
        ),
        message=text(page, "error") or text(page, "progress-text"),
    )
    request_id = re.search(r"img-[0-9a-f]+", text(page, "status")).group(0)
    by_id(page, "stop").click()
    wait(
        page,
        lambda d: text(d, "status").startswith("Stopped"),
        timeout=10,
        message=text(page, "status"),
    )
    deadline = time.monotonic() + 30
    while True:  # the engine stops the batch at its next step
        after = scrape(server)
        if metric(after, "diffserve_batches_total", outcome="aborted") > metric(
            before, "diffserve_batches_total", outcome="aborted"
        ):
            break
        assert time.monotonic() < deadline, (
            "the server did not abort the stopped request"
        )
        time.sleep(0.05)
    assert (
        metric(after, "diffserve_requests_aborted_total")
        == metric(before, "diffserve_requests_aborted_total") + 1
    )
    assert metric(after, "diffserve_images_generated_total") == metric(
        before, "diffserve_images_generated_total"
    )
    assert f"aborting {request_id}" in server.log()
    # The server still serves, and the page with it.
    fill(page, steps="2")
    by_id(page, "generate").click()
    wait(
        page,
        lambda d: text(d, "status").startswith("Done"),
        message=text(page, "error") or text(page, "status"),
    )
    assert len(page.find_elements("css selector", "#gallery li.card")) == cards + 1


def test_accessibility_basics(page, server) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    unlock(page, server)
    unlabeled = page.execute_script(
        "return Array.from(document.querySelectorAll('input, textarea, select, "
        "progress')).filter((e) => !e.labels || !e.labels.length).map((e) => e.id)"
    )
    assert not unlabeled, unlabeled
    assert page.find_element("tag name", "html").get_attribute("lang") == "en"
    for img in page.find_elements("css selector", "#gallery img"):
        assert "seed" in img.get_attribute("alt")
    # Keyboard: Tab walks from the top of the page through every control to Generate.
    page.execute_script("document.activeElement.blur(); window.scrollTo(0, 0)")
    order = []
    for _ in range(40):
        ActionChains(page).send_keys(Keys.TAB).perform()
        order.append(page.execute_script("return document.activeElement.id"))
        if order[-1] == "generate":
            break
    expected = [
        "prompt",
        "width",
        "height",
        "steps",
        "n",
        "guidance",
        "seed-random",
        "loras",
        "edit-image",
        "strength",
        "generate",
    ]
    assert [i for i in order if i in expected] == expected, order
    # The random toggle by keyboard enables the seed field.
    by_id(page, "seed-random").send_keys(" ")
    assert by_id(page, "seed").is_enabled()
    by_id(page, "seed-random").send_keys(" ")
    low = [
        (name, round(ratio, 2))
        for name, ratio in page.execute_script(
            CONTRAST_JS,
            "h1, h2, p, label, button, a, dt, dd, th, td, textarea, "
            "input, #progress-text",
        )
        if ratio < 4.5
    ]
    assert not low, f"text below WCAG AA contrast (4.5:1): {low}"


# --- example prompts: each model's marker file lists prompts it knows; the prompt box
# starts from the first ------
TOY_SHAPES = Path(__file__).resolve().parents[2] / "diffserve" / "assets" / "toy-shapes"
BOAT_EXAMPLES = ["a paper boat on a pond", "a kite over a beach"]


@pytest.fixture(scope="module")
def examples_server(server_launcher, write_deploy, tiny_flux_dir, tmp_path_factory):
    """The shipped toy-shapes, then ``boats``: tiny FLUX with a marker that lists
    ``BOAT_EXAMPLES``."""
    boats = tmp_path_factory.mktemp("boats") / "boats"
    shutil.copytree(tiny_flux_dir, boats)
    marker = json.loads((boats / "diffserve_model.json").read_text(encoding="utf-8"))
    (boats / "diffserve_model.json").write_text(
        json.dumps({**marker, "example_prompts": BOAT_EXAMPLES}), encoding="utf-8"
    )
    deploy = write_deploy(f"""
models:
  - {{model: {TOY_SHAPES}, name: toy-shapes}}
  - {{model: {boats}, name: boats}}
""")
    with server_launcher("--deploy-config", deploy) as proc:
        yield proc


def test_the_model_list_carries_each_models_example_prompts(examples_server) -> None:
    shipped = json.loads(
        (TOY_SHAPES / "diffserve_model.json").read_text(encoding="utf-8")
    )["example_prompts"]
    assert shipped[0] == "a red circle on a blue background"
    cards = {
        card["id"]: card["diffserve"]
        for card in httpx.get(examples_server.url + "/v1/models").json()["data"]
    }
    assert cards["toy-shapes"]["example_prompts"] == shipped
    assert cards["boats"]["example_prompts"] == BOAT_EXAMPLES
    one = httpx.get(examples_server.url + "/v1/models/boats").json()
    assert one["diffserve"]["example_prompts"] == BOAT_EXAMPLES


def test_the_prompt_box_starts_from_the_picked_models_first_example(
    examples_server, tmp_path
) -> None:
    from selenium.webdriver.support.ui import Select

    found = find_browser()
    if isinstance(found, str):
        pytest.skip(f"no browser for the playground test: {found}")
    driver = start_chromium(
        *found, profile_dir=tmp_path / "profile", log_path=tmp_path / "chromedriver.log"
    )

    def prompt_is(expected: str) -> None:
        wait(
            driver,
            lambda d: by_id(d, "prompt").get_attribute("value") == expected,
            message=f"prompt {by_id(driver, 'prompt').get_attribute('value')!r}, "
            f"expected {expected!r}",
        )

    try:
        driver.get(examples_server.url + "/")
        wait(
            driver,
            lambda d: (
                d.execute_script("return document.body.dataset.model") == "toy-shapes"
            ),
        )
        # The first model's first example.
        prompt_is("a red circle on a blue background")
        Select(by_id(driver, "model-picker")).select_by_value("boats")
        prompt_is(BOAT_EXAMPLES[0])
        Select(by_id(driver, "model-picker")).select_by_value("toy-shapes")
        prompt_is("a red circle on a blue background")
        # A prompt the user typed stays whatever model is picked.
        fill(driver, prompt="a green ring on a white background")
        Select(by_id(driver, "model-picker")).select_by_value("boats")
        wait(
            driver,
            lambda d: d.execute_script("return document.body.dataset.model") == "boats",
        )
        assert (
            by_id(driver, "prompt").get_attribute("value")
            == "a green ring on a white background"
        )
    finally:
        driver.quit()
