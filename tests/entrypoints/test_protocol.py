"""Parsing of the images API body: strict, every error names its field, limits are 422
not 400."""

from __future__ import annotations

import json

import pytest

from diffserve.config.server_schema import ServerConfig
from diffserve.engine.admission import admit
from diffserve.entrypoints.api_errors import to_api_error
from diffserve.entrypoints.openai.protocol import parse_body, to_generation_request
from diffserve.entrypoints.request_fields import parse_size
from diffserve.errors import (
    EngineDeadError,
    EngineNotReadyError,
    EngineOverloadedError,
    LimitExceededError,
    RequestError,
)

LIMITS = ServerConfig(max_n=4, max_pixels=256 * 256, max_steps=10)


def body(**fields: object) -> bytes:
    return json.dumps({"prompt": "a fox", **fields}).encode()


def test_minimal_body_uses_openai_defaults() -> None:
    req = parse_body(body())
    assert (req.n, req.response_format, req.output_format, req.stream) == (
        1,
        "b64_json",
        "png",
        False,
    )
    gen = to_generation_request(req, "rid")
    assert gen.seed is None and gen.height is None and gen.width is None
    # Unset extensions stay unset: admission fills them from the deployment (the model's
    # defaults).
    assert (
        gen.num_inference_steps is None
        and gen.guidance_scale is None
        and gen.max_sequence_length is None
    )
    assert gen.loras == ()


def test_extensions_reach_the_generation_request() -> None:
    req = parse_body(
        body(
            size="128x64",
            n=2,
            seed=7,
            num_inference_steps=3,
            guidance_scale=0,
            true_cfg_scale=1.5,
            negative_prompt="blur",
            output_format="webp",
            output_compression=80,
            response_format="url",
            user="u1",
        )
    )
    gen = to_generation_request(req, "rid")
    assert (gen.width, gen.height, gen.n, gen.seed, gen.num_inference_steps) == (
        128,
        64,
        2,
        7,
        3,
    )
    assert (gen.guidance_scale, gen.true_cfg_scale, gen.negative_prompt) == (
        0.0,
        1.5,
        "blur",
    )
    assert gen.request_id == "rid"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"n": "2"}, "n", "invalid_value"),
        ({"n": 0}, "n", "invalid_value"),
        ({"output_format": "gif"}, "output_format", "invalid_value"),
        ({"response_format": "file"}, "response_format", "invalid_value"),
        ({"output_compression": 101}, "output_compression", "invalid_value"),
        ({"seed": -1}, "seed", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_value"),
        ({"prompt": ""}, "prompt", "invalid_value"),
        ({"bogus": 1}, "bogus", "unknown_parameter"),
        ({"quality": "hd"}, "quality", "unsupported_parameter"),
    ],
)
def test_bad_values_name_their_field(fields: dict, param: str, code: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_body(body(**fields))
    assert (info.value.param, info.value.code) == (param, code)
    assert to_api_error(info.value).status == 400


def test_missing_prompt_and_bad_json() -> None:
    with pytest.raises(RequestError) as info:
        parse_body(b'{"n": 1}')
    assert (info.value.param, info.value.code) == ("prompt", "missing_parameter")
    with pytest.raises(RequestError) as info:
        parse_body(b"{not json")
    assert info.value.code == "invalid_json"
    with pytest.raises(RequestError):
        parse_body(b"[1, 2]")


@pytest.mark.parametrize(
    "size", ["128", "100x128", "0x0", "128x128x1", "-16x16", "axb"]
)
def test_bad_sizes(size: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_size(size)
    assert info.value.param == "size"


def test_size_parsing() -> None:
    assert parse_size("256x128") == (256, 128)
    assert parse_size("auto") == (None, None)
    assert parse_size(None) == (None, None)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 5}, "n"),
        ({"size": "512x512"}, "size"),
        ({"num_inference_steps": 11}, "num_inference_steps"),
    ],
)
def test_deployment_limits_are_422(fields: dict, param: str) -> None:
    # The one place limits are applied is engine admission; the HTTP layer only maps the
    # error to 422.
    gen = to_generation_request(parse_body(body(**fields)), "rid")
    with pytest.raises(LimitExceededError) as info:
        admit(gen, LIMITS, None)
    err = to_api_error(info.value)
    assert (err.status, err.param, err.code) == (422, param, "limit_exceeded")


def test_engine_validation_is_400() -> None:
    # Within the limits but rejected by the engine's own checks (true CFG below 1).
    with pytest.raises(RequestError) as info:
        to_generation_request(parse_body(body(true_cfg_scale=0.5)), "rid")
    assert (
        to_api_error(info.value).status == 400 and info.value.param == "true_cfg_scale"
    )


def test_engine_errors_map_to_statuses() -> None:
    assert to_api_error(EngineOverloadedError("full")).status == 429
    assert to_api_error(EngineNotReadyError("loading")).code == "engine_not_ready"
    dead = to_api_error(EngineDeadError("gone"))
    assert (dead.status, dead.code, dead.type) == (503, "engine_dead", "server_error")
    assert dead.headers()["Retry-After"]
    body_ = to_api_error(RuntimeError("boom")).body()
    assert (
        set(body_["error"]) == {"message", "type", "param", "code"}
        and body_["error"]["code"] == "internal_error"
    )
