"""Every error status of the API, produced against the real server; it keeps serving
afterwards."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.e2e

FAST = {"num_inference_steps": 2}
GEN = "/v1/images/generations"


@pytest.fixture(scope="module")
def server(uni_server):
    return uni_server


@pytest.fixture(autouse=True)
def still_serving(client):
    """After each error test, a normal request still succeeds."""
    yield
    result = client.images.generate(
        prompt="still alive", size="32x32", extra_body={"num_inference_steps": 1}
    )
    assert len(result.data) == 1 and result.size == "32x32"


def error_of(exc: openai.APIStatusError) -> dict:
    body = exc.body
    assert set(body) == {"message", "type", "param", "code"}, body
    return body


@pytest.mark.parametrize(
    ("kwargs", "param", "code"),
    [
        ({"size": "100x100"}, "size", "invalid_value"),
        ({"n": 0}, "n", "invalid_value"),
        (
            {"extra_body": {"num_inference_steps": "two"}},
            "num_inference_steps",
            "invalid_value",
        ),
        ({"extra_body": {"seed": -5}}, "seed", "invalid_value"),
        (
            {"extra_body": {"max_sequence_length": 0}},
            "max_sequence_length",
            "invalid_value",
        ),
        ({"extra_body": {"not_a_field": 1}}, "not_a_field", "unknown_parameter"),
        ({"quality": "hd"}, "quality", "unsupported_parameter"),
    ],
)
def test_bad_values_are_400(client, kwargs: dict, param: str, code: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(prompt="x", **kwargs)
    err = error_of(info.value)
    assert (info.value.status_code, err["param"], err["code"], err["type"]) == (
        400,
        param,
        code,
        "invalid_request_error",
    )
    assert param in err["message"]


def test_malformed_json_is_400(server) -> None:
    resp = httpx.post(
        server.url + GEN,
        headers={**server.auth, "Content-Type": "application/json"},
        content=b'{"prompt": ',
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"


def test_missing_or_wrong_api_key_is_401(server) -> None:
    resp = httpx.post(server.url + GEN, json={"prompt": "x"})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "missing_api_key"
    wrong = openai.OpenAI(
        base_url=server.url + "/v1", api_key="test-key-124", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.images.generate(prompt="x", size="64x64", extra_body=FAST)
    assert error_of(info.value)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    # Probes and metrics stay open for load balancers and scrapers.
    for path in ("/health", "/ready", "/metrics"):
        assert httpx.get(server.url + path).status_code == 200


def test_unknown_model_is_404(server, client) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.images.generate(
            model="dall-e-3", prompt="x", size="64x64", extra_body=FAST
        )
    err = error_of(info.value)
    assert (err["param"], err["code"]) == ("model", "model_not_found")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("dall-e-3")
    assert (
        httpx.get(
            server.url + "/v1/images/0123456789abcdef.png", headers=server.auth
        ).status_code
        == 404
    )


def test_oversized_body_is_413_before_parsing(server) -> None:
    # max_body_bytes is 65536 in the deploy config; neither body is valid JSON, so a 413
    # (not a 400) proves the size check ran first.
    resp = httpx.post(server.url + GEN, headers=server.auth, content=b"{" * 70_000)
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"

    def chunks():  # no Content-Length: refused while reading
        for _ in range(10):
            yield b"{" * 10_000

    resp = httpx.post(server.url + GEN, headers=server.auth, content=chunks())
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 4}, "n"),
        ({"size": "2048x1024"}, "size"),
        ({"extra_body": {"num_inference_steps": 1001}}, "num_inference_steps"),
    ],
)
def test_over_server_limits_is_422(client, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.images.generate(prompt="x", **kwargs)
    err = error_of(info.value)
    assert (err["param"], err["code"]) == (param, "limit_exceeded")


def queue_depth(server) -> float:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith("diffserve_queue_depth "):
            return float(line.split()[1])
    raise AssertionError("no diffserve_queue_depth in /metrics")


def test_queue_full_is_429(server, client) -> None:
    # max_queue=1: A runs, B waits, C is refused. A is streamed so the test knows when
    # it runs, and is long enough (1000 steps) to still be running when C arrives;
    # closing it aborts it.
    long = {
        "prompt": "long",
        "size": "256x256",
        "num_inference_steps": 1000,
        "stream": True,
    }
    short = {
        "prompt": "queued",
        "size": "64x64",
        "num_inference_steps": 2,
        "stream": True,
    }
    with httpx.stream(
        "POST", server.url + GEN, headers=server.auth, json=long, timeout=120
    ) as running:
        assert running.status_code == 200
        # Keep the line iterator referenced: a dropped one is garbage-collected, which
        # closes the connection, and the server then (rightly) aborts A as a
        # disconnected client.
        running_lines = running.iter_lines()
        next(line for line in running_lines if line.startswith("data: "))
        with httpx.stream(
            "POST", server.url + GEN, headers=server.auth, json=short, timeout=120
        ) as queued:
            # A queued stream gets its 200 header at once, not when it starts running.
            assert queued.status_code == 200
            deadline = time.monotonic() + 30
            while queue_depth(server) < 1:
                assert time.monotonic() < deadline, "the second request never queued"
                time.sleep(0.02)
            with pytest.raises(openai.RateLimitError) as info:
                client.images.generate(prompt="refused", size="64x64", extra_body=FAST)
            assert (
                info.value.status_code == 429
                and error_of(info.value)["code"] == "queue_full"
            )
            assert info.value.response.headers["retry-after"]
            refused = httpx.post(
                server.url + GEN,
                headers=server.auth,
                json={**short, "prompt": "refused"},
            )
            assert (
                refused.status_code == 429
                and refused.json()["error"]["code"] == "queue_full"
            ), refused.text
            running.close()  # disconnect: A is aborted and B runs
            events = [
                json.loads(line[6:])
                for line in queued.iter_lines()
                if line.startswith("data: {")
            ]
    assert [e["type"] for e in events] == ["progress", "progress", "result"]
    assert len(events[-1]["data"]) == 1
