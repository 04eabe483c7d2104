"""LoRA over HTTP and from the CLI: the ``openai`` client's ``extra_body={"loras":
[...]}`` against a real ``diffserve serve --lora name=path``, 400s naming ``loras`` (the
server keeps serving), the attestation, and ``diffserve generate --lora FILE:SCALE``.

The server batches step-level (up to 4 requests and 64 latent tokens a step, First-Block
Cache available, threshold 0 unless a request asks): requests of other sizes, step
counts, cache thresholds and adapters join one running batch, each equal to its request
alone, and a large request is not starved by a stream of small ones."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from PIL import Image
from test_e2e_generate_cli import run_in_process

from diffserve.zoo.lora import build_flux_lora

pytestmark = pytest.mark.e2e

BODY = {"num_inference_steps": 2, "seed": 9, "max_sequence_length": 32}


@pytest.fixture(scope="module")
def lora_file(tiny_flux_dir, tmp_path_factory):
    return build_flux_lora(
        tiny_flux_dir, tmp_path_factory.mktemp("lora") / "style", seed=7
    )


@pytest.fixture(scope="module")
def lora_client(server_launcher, tiny_flux_dir, lora_file):
    with server_launcher(
        tiny_flux_dir,
        "--enforce-eager",
        "--dtype",
        "float32",
        "--lora",
        f"style={lora_file}",
        "--max-lora-scale",
        "2",
        "--served-model-name",
        "tiny-flux",
        "--max-steps",
        "300",
        "--max-batch-size",
        "4",
        # One 128x128 request's tokens a step (16x16-pixel tokens): four 32x32 ones
        # leave no room for it.
        "--max-step-tokens",
        "64",
        "--cache-backend",
        "fbcache",
        "--cache-threshold",
        "0",
    ) as server:
        client = openai.OpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )
        client.server_url = server.url  # type: ignore[attr-defined]
        yield client


def generate(client, size="64x64", **extra):
    return client.images.generate(
        model="tiny-flux", prompt="a red fox", size=size, extra_body={**BODY, **extra}
    )


def metric(client, name: str) -> float:
    text = httpx.get(client.server_url + "/metrics", timeout=10).text
    prefix = name + '{model="tiny-flux"}'
    line = next(x for x in text.splitlines() if x.startswith(prefix))
    return float(line.split()[-1])


def joins(client) -> float:
    return metric(client, "diffserve_model_step_joins_total")


def running_tokens(client) -> float:
    return metric(client, "diffserve_model_step_tokens_running")


# Each joiner differs from the running request in one thing the runner carries per
# request: its size (a shape group of its own), its steps (its own schedule), its cache
# slot, its adapters; the last has them all.
MIXED = [
    {"size": "32x64", "seed": 2},
    {"num_inference_steps": 3, "seed": 3},
    {"cache_threshold": 0.5, "seed": 4},
    {"loras": [{"name": "style", "scale": 1.5}], "seed": 5},
    {
        "size": "32x64",
        "num_inference_steps": 5,
        "cache_threshold": 0.3,
        "loras": [{"name": "style", "scale": -0.7}],
        "seed": 6,
    },
]


def test_mixed_requests_join_one_batch_each_equal_to_alone(lora_client) -> None:
    before = joins(lora_client)
    with ThreadPoolExecutor(len(MIXED) + 1) as pool:
        # Long enough (300 steps) that every joiner (5 steps at most) runs beside it.
        first = pool.submit(generate, lora_client, num_inference_steps=300, seed=1)
        deadline = time.monotonic() + 60
        while running_tokens(lora_client) == 0:  # the first request runs
            assert time.monotonic() < deadline and not first.done()
            time.sleep(0.02)
        mixed = [pool.submit(generate, lora_client, **extra) for extra in MIXED]
        together = [f.result() for f in mixed]
        first.result()
    # They joined the running batch (at most 4 requests at once: the rest joined as
    # rows left).
    assert joins(lora_client) - before >= len(MIXED) - 1
    for extra, reply in zip(MIXED, together, strict=True):
        alone = generate(lora_client, **extra)
        assert reply.data[0].b64_json == alone.data[0].b64_json, extra
        ours, theirs = (
            r.model_extra["diffserve"]["attestation"] for r in (reply, alone)
        )
        assert ours["cache"] == theirs["cache"], extra
        assert ours.get("lora") == theirs.get("lora"), extra
    skipped = together[2].model_extra["diffserve"]["attestation"]["cache"][0]
    assert skipped["threshold"] == 0.5


def test_a_large_request_is_not_starved_by_small_ones(lora_client) -> None:
    # Four streams of small requests keep the batch busy; a large one (the whole budget:
    # it never fits beside them) arrives in the middle. Without the scheduler's
    # reservation the small ones would refill every freed token and it would wait
    # forever (the client's 120 s timeout); with it, the small ones stop joining, drain,
    # and it runs.
    stop, finished = threading.Event(), []

    def small_stream(seed: int) -> None:
        while not stop.is_set():
            generate(lora_client, size="32x32", num_inference_steps=4, seed=seed)
            finished.append(time.monotonic())

    streams = [threading.Thread(target=small_stream, args=(s,)) for s in range(4)]
    for thread in streams:
        thread.start()
    try:
        time.sleep(1.0)
        large = generate(lora_client, size="128x128", num_inference_steps=4, seed=9)
        assert large.data[0].b64_json
        done = time.monotonic()
    finally:
        stop.set()
        for thread in streams:
            thread.join(timeout=120)
    # The small requests were still flowing when the large one finished.
    assert len(finished) >= 4 and any(t > done for t in finished)


def test_adapter_chosen_per_request_is_applied_and_attested(lora_client) -> None:
    base = generate(lora_client)
    styled = generate(lora_client, loras=[{"name": "style", "scale": 1.5}])
    assert base.data[0].b64_json != styled.data[0].b64_json
    info = styled.model_extra["diffserve"]["attestation"]
    assert info["lora"] == {"adapters": [{"name": "style", "scale": 1.5}]}
    assert info["lora_linear_calls"] > 0
    assert "lora" not in base.model_extra["diffserve"]["attestation"]
    # The base model again, bit for bit: nothing leaked from the adapter request.
    assert generate(lora_client).data[0].b64_json == base.data[0].b64_json


@pytest.mark.parametrize(
    "loras",
    [
        [{"name": "nope"}],
        [{"name": "style", "scale": 3.0}],
        [{"name": "/etc/passwd"}],
        [{"name": "style", "scale": "x"}],
        [{"name": "style", "bad": 1}],
    ],
)
def test_bad_adapter_choices_are_400_naming_loras(lora_client, loras) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        generate(lora_client, loras=loras)
    assert str(info.value.body["param"]).startswith("loras")
    assert generate(lora_client).data  # the server keeps serving


def test_generate_cli_applies_a_lora_file(
    tiny_flux_dir, lora_file, tmp_path, capsys
) -> None:
    plain, styled = tmp_path / "plain.png", tmp_path / "styled.png"
    common = [
        str(tiny_flux_dir),
        "a red fox",
        "--size",
        "64x64",
        "--steps",
        "2",
        "--seed",
        "4",
        "--no-progress",
        "--enforce-eager",
        "--max-sequence-length",
        "32",
    ]
    for out, extra in ((plain, []), (styled, ["--lora", f"{lora_file}:0.9"])):
        done = run_in_process(capsys, "generate", *common, "--output", str(out), *extra)
        assert done.returncode == 0, done.stderr
    assert Image.open(plain).tobytes() != Image.open(styled).tobytes()
