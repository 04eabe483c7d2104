"""Hostile and random bodies against a real server: each answer is a documented 4xx
naming the field, nothing is a 5xx, the log has no traceback, memory stays bounded and
the server keeps serving."""

from __future__ import annotations

import json
import warnings
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from adversarial_helpers import AUTH, GEN, assert_clean_log, generate_ok, rss_mib
from hypothesis import strategies as st
from hypothesis.errors import NonInteractiveExampleWarning

pytestmark = pytest.mark.e2e

# (status -> codes) exactly as the table in docs/api.md lists them; 200 is a valid
# random body.
DOCUMENTED = {
    200: {None},
    400: {
        "invalid_value",
        "unknown_parameter",
        "unsupported_parameter",
        "missing_parameter",
        "invalid_json",
        "invalid_host",
        "invalid_header",
    },
    401: {"missing_api_key", "invalid_api_key"},
    404: {"model_not_found", "image_not_found", "not_found"},
    405: {"method_not_allowed"},
    408: {"body_timeout"},
    413: {"body_too_large"},
    415: {"unsupported_media_type"},
    422: {"limit_exceeded"},
    429: {"queue_full"},
}
# Codes about one field must say which.
NEEDS_PARAM = {
    "invalid_value",
    "unknown_parameter",
    "unsupported_parameter",
    "missing_parameter",
    "limit_exceeded",
    "invalid_host",
    "unsupported_media_type",
    "model_not_found",
}
JSON = {**AUTH, "Content-Type": "application/json"}
RSS_GROWTH_LIMIT_MIB = 150
FUZZ_REQUESTS = 240

# (method, path, headers, body bytes, expected status, expected code, expected param)
HOSTILE: list[tuple[str, str, dict[str, str], bytes, int, str, str | None]] = [
    ("POST", GEN, JSON, b"[" * 5000 + b"]" * 5000, 400, "invalid_json", None),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        400,
        "invalid_json",
        None,
    ),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "size": "32x32", "true_cfg_scale": 1e400}',
        400,
        "invalid_value",
        "true_cfg_scale",
    ),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "size": "32x32", "guidance_scale": 1e400}',
        400,
        "invalid_value",
        "guidance_scale",
    ),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "size": "32x32", "guidance_scale": NaN}',
        400,
        "invalid_value",
        "guidance_scale",
    ),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "size": "32x32", "guidance_scale": -Infinity}',
        400,
        "invalid_value",
        "guidance_scale",
    ),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "size": "32x32", "guidance_scale": 100.5}',
        400,
        "invalid_value",
        "guidance_scale",
    ),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "size": "32x32", "true_cfg_scale": 101}',
        400,
        "invalid_value",
        "true_cfg_scale",
    ),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "n": 1' + b"0" * 5000 + b"}",
        400,
        "invalid_json",
        None,
    ),
    ("POST", GEN, JSON, b'{"prompt": "\xff\xfe"}', 400, "invalid_json", None),
    ("POST", GEN, JSON, b"[]", 400, "invalid_json", None),
    (
        "POST",
        GEN,
        JSON,
        json.dumps({"prompt": "x" * 201, "size": "32x32"}).encode(),
        422,
        "limit_exceeded",
        "prompt",
    ),
    (
        "POST",
        GEN,
        JSON,
        json.dumps(
            {"prompt": "x", "negative_prompt": "y" * 201, "size": "32x32"}
        ).encode(),
        422,
        "limit_exceeded",
        "negative_prompt",
    ),
    (
        "POST",
        GEN,
        JSON,
        json.dumps({"prompt": "x", "user": "u" * 201, "size": "32x32"}).encode(),
        422,
        "limit_exceeded",
        "user",
    ),
    # No size: the model's default (128x128) counts against max_pixels (64x64).
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "num_inference_steps": 1}',
        422,
        "limit_exceeded",
        "size",
    ),
    (
        "POST",
        GEN,
        {**AUTH, "Content-Type": "text/plain"},
        b'{"prompt": "x", "size": "32x32"}',
        415,
        "unsupported_media_type",
        "Content-Type",
    ),
    (
        "POST",
        GEN,
        {**AUTH, "Content-Type": "application/x-www-form-urlencoded"},
        b"prompt=x",
        415,
        "unsupported_media_type",
        "Content-Type",
    ),
    (
        "POST",
        GEN,
        {**AUTH, "Content-Type": "application/json; charset=latin-1"},
        b'{"prompt": "x"}',
        415,
        "unsupported_media_type",
        "Content-Type",
    ),
    (
        "POST",
        GEN,
        {**AUTH},
        b'{"prompt": "x"}',
        415,
        "unsupported_media_type",
        "Content-Type",
    ),
    (
        "POST",
        GEN,
        {**JSON, "Host": "evil.example"},
        b'{"prompt": "x", "size": "32x32"}',
        400,
        "invalid_host",
        "Host",
    ),
    (
        "GET",
        "/v1/models",
        {**AUTH, "Host": "rebind.attacker.test:80"},
        b"",
        400,
        "invalid_host",
        "Host",
    ),
    ("GET", "/v1/nope", AUTH, b"", 404, "not_found", None),
    ("GET", "/v1/nope", {}, b"", 401, "missing_api_key", None),
    ("GET", "/v1/images/0123456789abcdef.png", {}, b"", 401, "missing_api_key", None),
    (
        "GET",
        "/v1/config",
        {"Authorization": "Bearer wrong"},
        b"",
        401,
        "invalid_api_key",
        None,
    ),
    ("PUT", GEN, JSON, b"{}", 405, "method_not_allowed", None),
    ("DELETE", "/health", AUTH, b"", 405, "method_not_allowed", None),
    ("POST", "/v1/nowhere", JSON, b'{"prompt": "x"}', 404, "not_found", None),
    ("POST", GEN, JSON, b"{" * 70_000, 413, "body_too_large", None),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "quality": "hd"}',
        400,
        "unsupported_parameter",
        "quality",
    ),
    (
        "POST",
        GEN,
        JSON,
        b'{"prompt": "x", "model": "dall-e-3", "size": "32x32"}',
        404,
        "model_not_found",
        "model",
    ),
]

FIELDS = [
    "prompt",
    "model",
    "n",
    "size",
    "response_format",
    "output_format",
    "output_compression",
    "user",
    "negative_prompt",
    "num_inference_steps",
    "guidance_scale",
    "true_cfg_scale",
    "seed",
    "max_sequence_length",
    "stream",
    "quality",
    "zzz",
]
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-2, max_value=70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=260),
    st.sampled_from(
        [
            "32x32",
            "64x64",
            "auto",
            "64x32",
            "100x100",
            "99999x99999",
            "png",
            "url",
            "b64_json",
        ]
    ),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
BODIES = st.dictionaries(st.sampled_from(FIELDS), ANY_VALUE, max_size=6)


def random_bodies(count: int) -> list[bytes]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonInteractiveExampleWarning)
        out = []
        for _ in range(count):
            body = BODIES.example()
            # Steer most bodies past the first check so the later fields get exercised
            # too.
            if len(out) % 3:
                body = {
                    "prompt": "fuzz",
                    "size": "32x32",
                    "num_inference_steps": 1,
                    **body,
                }
            out.append(json.dumps(body, allow_nan=True).encode())
        return out


def check_answer(resp: httpx.Response) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    assert resp.status_code in DOCUMENTED, (resp.status_code, resp.text[:500])
    if resp.status_code == 200:
        return
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["code"] in DOCUMENTED[resp.status_code], (resp.status_code, error)
    if error["code"] in NEEDS_PARAM:
        assert error["param"], error


def test_hostile_inputs_get_their_documented_errors(hardened_server) -> None:
    with httpx.Client(base_url=hardened_server.url, timeout=30) as client:
        for method, path, headers, body, status, code, param in HOSTILE:
            resp = client.request(method, path, headers=headers, content=body or None)
            check_answer(resp)
            error = resp.json()["error"]
            assert (resp.status_code, error["code"], error["param"]) == (
                status,
                code,
                param,
            ), (path, body[:80], error)
    assert_clean_log(hardened_server)
    generate_ok(hardened_server)


def test_accepted_json_media_types(hardened_server) -> None:
    for content_type in (
        "application/json; charset=utf-8",
        "application/vnd.diffserve+json",
        "Application/JSON",
    ):
        resp = httpx.post(
            hardened_server.url + GEN,
            headers={**AUTH, "Content-Type": content_type},
            content=b'{"prompt": "x", "size": "32x32", "num_inference_steps": 1}',
            timeout=60,
        )
        assert resp.status_code == 200, (content_type, resp.text)
    resp = httpx.get(
        hardened_server.url + "/health", headers={"Host": "LOCALHOST:1234"}
    )
    # An allowed host without a port matches any port, case-insensitively.
    assert resp.status_code == 200


def test_concurrent_fuzz_is_all_documented_4xx(hardened_server) -> None:
    requests = [(m, p, h, b) for m, p, h, b, *_ in HOSTILE] + [
        ("POST", GEN, JSON, b) for b in random_bodies(FUZZ_REQUESTS)
    ]
    generate_ok(hardened_server)  # warm before measuring memory
    rss_before = rss_mib(hardened_server)
    with (
        httpx.Client(
            base_url=hardened_server.url,
            timeout=60,
            limits=httpx.Limits(max_connections=16),
        ) as client,
        ThreadPoolExecutor(16) as pool,
    ):
        answers = list(
            pool.map(
                lambda r: client.request(
                    r[0], r[1], headers=r[2], content=r[3] or None
                ),
                requests,
            )
        )
    assert len(answers) == len(requests) >= 250
    for resp in answers:
        check_answer(resp)
    # The fuzz mostly hit errors.
    assert sum(r.status_code >= 400 for r in answers) > len(answers) // 2
    assert_clean_log(hardened_server)
    generate_ok(hardened_server)
    growth = rss_mib(hardened_server) - rss_before
    assert growth < RSS_GROWTH_LIMIT_MIB, f"server RSS grew {growth:.0f} MiB"
