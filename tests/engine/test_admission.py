"""Admission: the one check of a request against the deployment's limits and the model's
capabilities."""

from __future__ import annotations

import pytest

from diffserve.config.server_schema import ServerConfig
from diffserve.config.stage_sections import RequestDefaultsConfig
from diffserve.engine.admission import admit
from diffserve.errors import LimitExceededError, RequestError
from diffserve.types.capabilities import PipelineCapabilities
from diffserve.types.request import GenerationRequest

SERVER = ServerConfig(max_n=2, max_pixels=128 * 128, max_steps=8)
CAPS = PipelineCapabilities(
    family="TestPipeline",
    default_size=256,
    size_multiple=32,
    max_sequence_length=256,
    true_cfg=False,
    attention_roles=("block",),
)


def req(**kw) -> GenerationRequest:
    return GenerationRequest(
        **{
            "prompt": "a fox",
            "height": 64,
            "width": 64,
            "num_inference_steps": 2,
            "max_sequence_length": 64,
            **kw,
        }
    )


def test_fields_are_checked_when_the_request_is_built() -> None:
    with pytest.raises(RequestError) as info:
        req(height=100)
    assert info.value.param == "height"


@pytest.mark.parametrize(
    "kw, param",
    [
        (dict(n=3), "n"),
        (dict(height=256, width=256), "size"),
        (dict(num_inference_steps=9), "num_inference_steps"),
    ],
)
def test_deployment_limits_are_limit_errors(kw: dict, param: str) -> None:
    with pytest.raises(LimitExceededError) as info:
        admit(req(**kw), SERVER, None)
    assert (info.value.param, info.value.code) == (param, "limit_exceeded")


def test_a_size_left_to_the_model_counts_as_its_default_size() -> None:
    admit(req(height=None, width=None), SERVER, None)  # unknown model: nothing to count
    with pytest.raises(LimitExceededError, match="256x256"):
        admit(req(height=None, width=None), SERVER, CAPS)


@pytest.mark.parametrize(
    "kw, param, text",
    [
        (dict(width=48), "width", "must be a multiple of 32 for this model (e.g. 32)"),
        (
            dict(max_sequence_length=300),
            "max_sequence_length",
            "above this model's 256 tokens",
        ),
        (
            dict(negative_prompt="dark", true_cfg_scale=2.0),
            "true_cfg_scale",
            "does not run true CFG",
        ),
    ],
)
def test_model_capabilities_are_request_errors(kw: dict, param: str, text: str) -> None:
    with pytest.raises(RequestError) as info:
        admit(req(**kw), ServerConfig(), CAPS)
    assert info.value.param == param and text in str(info.value)
    assert not isinstance(info.value, LimitExceededError)


def test_the_seed_is_assigned_once_here() -> None:
    given = req(seed=7, guidance_scale=2.0)  # every field set: nothing to fill
    assert admit(given, ServerConfig(), CAPS) is given
    chosen = admit(req(seed=None), ServerConfig(), CAPS)
    assert chosen.seed is not None and chosen.seeds == [chosen.seed]


@pytest.mark.parametrize("name", ["prompt", "negative_prompt"])
def test_prompts_over_max_prompt_chars_are_limit_errors(name: str) -> None:
    server = ServerConfig(max_prompt_chars=10)
    admit(req(**{name: "x" * 10}), server, None)  # at the limit: admitted
    with pytest.raises(LimitExceededError) as info:
        admit(req(**{name: "x" * 11}), server, None)
    assert (info.value.param, info.value.code) == (name, "limit_exceeded")


@pytest.mark.parametrize("name", ["guidance_scale", "true_cfg_scale"])
@pytest.mark.parametrize(
    "value", [float("inf"), float("-inf"), float("nan"), 100.5, "3"]
)
def test_float_fields_must_be_finite_and_bounded(name: str, value: object) -> None:
    with pytest.raises(RequestError) as info:
        req(**{name: value})
    assert info.value.param == name
    req(**{name: 100.0})  # the documented upper bound itself is accepted


def test_unset_fields_take_the_deployment_defaults_and_the_model_text_limit() -> None:
    bare = GenerationRequest(prompt="a fox", seed=1)
    assert (
        bare.num_inference_steps,
        bare.guidance_scale,
        bare.max_sequence_length,
    ) == (None, None, None)
    defaults = RequestDefaultsConfig(num_inference_steps=7, guidance_scale=4.5)
    admitted = admit(bare, ServerConfig(), CAPS, defaults=defaults)
    assert (
        admitted.num_inference_steps,
        admitted.guidance_scale,
        admitted.max_sequence_length,
    ) == (7, 4.5, 256)
    # A request's own values win; with no model and no deployment nothing is invented
    # here (a library call gets its model family's defaults from models.base.run_one:
    # tests/models/test_flux_pipeline.py).
    mine = admit(
        GenerationRequest(prompt="a fox", num_inference_steps=3, guidance_scale=0.0),
        ServerConfig(),
        None,
        defaults=defaults,
    )
    assert (
        mine.num_inference_steps,
        mine.guidance_scale,
        mine.max_sequence_length,
    ) == (3, 0.0, None)
    bare_engine = admit(GenerationRequest(prompt="a fox"), ServerConfig(), None)
    assert (bare_engine.num_inference_steps, bare_engine.guidance_scale) == (None, None)
    # The limit applies to the filled value: a deployment default above max_steps is
    # refused too.
    with pytest.raises(LimitExceededError) as info:
        admit(
            GenerationRequest(prompt="a fox", height=64, width=64),
            SERVER,
            CAPS,
            defaults=RequestDefaultsConfig(num_inference_steps=9),
        )
    assert info.value.param == "num_inference_steps"


def test_a_deployment_text_length_replaces_the_model_limit_and_a_request_own_wins() -> (
    None
):
    defaults = RequestDefaultsConfig(max_sequence_length=32)
    assert (
        admit(
            GenerationRequest(prompt="a fox"), ServerConfig(), CAPS, defaults=defaults
        ).max_sequence_length
        == 32
    )
    mine = admit(
        GenerationRequest(prompt="a fox", max_sequence_length=100),
        ServerConfig(),
        CAPS,
        defaults=defaults,
    )
    assert mine.max_sequence_length == 100


def test_an_engine_encodes_unset_text_lengths_to_the_deployment_default(
    tiny_flux_dir,
) -> None:
    """What reaches the worker: a request that sends no max_sequence_length draws the
    image of one that sends the default (tiny FLUX's T5 encodes its pads by position, so
    the window changes the image)."""
    import numpy as np

    from diffserve import Engine

    def image(engine: Engine, **kw: int) -> np.ndarray:
        request = GenerationRequest(
            prompt="a fox", height=64, width=64, num_inference_steps=2, seed=3, **kw
        )
        return np.asarray(engine.generate(request).images[0])

    with Engine(
        str(tiny_flux_dir),
        env={},
        enforce_eager=True,
        dtype="float32",
        request_defaults={"max_sequence_length": 16},
    ) as engine:
        unset, short, full = (
            image(engine),
            image(engine, max_sequence_length=16),
            image(engine, max_sequence_length=512),
        )
    assert np.array_equal(unset, short) and not np.array_equal(unset, full)
