"""A model directory's marker file (diffserve_model.json) may list prompts the model
knows, ``example_prompts``: checked when the config resolves, read by the server for the
playground's first prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_helpers import run

from diffserve.errors import ConfigError
from diffserve.registry.example_prompts import (
    model_example_prompts,
    parse_example_prompts,
)

ASSETS = Path(__file__).resolve().parents[2] / "diffserve" / "assets"


def _marker(model: Path, doc: object) -> Path:
    path = model / "diffserve_model.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_a_list_of_prompts_is_the_models_examples(flux_model: Path) -> None:
    examples = [
        "a red circle on a blue background",
        "a yellow star on a purple background",
    ]
    _marker(flux_model, {"kind": "toy", "example_prompts": examples})
    run(model=flux_model)  # resolves: the key is known and well formed
    assert parse_example_prompts({"example_prompts": examples}) == tuple(examples)
    assert model_example_prompts(str(flux_model)) == tuple(examples)


def test_a_model_without_examples_has_none(flux_model: Path, tmp_path: Path) -> None:
    assert (
        parse_example_prompts({"kind": "toy"}) == ()
        and parse_example_prompts(["not", "a", "mapping"]) == ()
    )
    assert model_example_prompts(str(flux_model)) == ()  # no marker file at all
    assert model_example_prompts(None) == ()


@pytest.mark.parametrize(
    ("declared", "key"),
    [
        (
            "a red circle on a blue background",
            "example_prompts must be a list of prompts, got str",
        ),
        (
            {"first": "a red circle"},
            "example_prompts must be a list of prompts, got dict",
        ),
        (
            ["a red circle on a blue background", 3],
            "example_prompts[1] must be a non-empty string, got 3",
        ),
        (["  "], "example_prompts[0] must be a non-empty string"),
    ],
)
def test_a_wrong_type_is_a_config_error_naming_the_file_and_key(
    flux_model: Path, declared: object, key: str
) -> None:
    marker = _marker(flux_model, {"example_prompts": declared})
    with pytest.raises(ConfigError) as info:
        run(model=flux_model)
    message = str(info.value)
    assert key in message, message
    assert f"{marker}: diffserve_model.json:example_prompts:" in message, message


@pytest.mark.parametrize("kind", ["toy-shapes", "toy-motion"])
def test_the_shipped_toy_models_declare_their_builders_examples_in_their_grammar(
    kind: str,
) -> None:
    """The shipped markers hold what their trainers write (so a retrain keeps them), all
    prompts of the grammar."""
    from diffserve.zoo.toy_motion import grammar as motion_grammar
    from diffserve.zoo.toy_motion import train as motion_train
    from diffserve.zoo.toy_shapes import grammar as shapes_grammar
    from diffserve.zoo.toy_shapes import train as shapes_train

    train, grammar = {
        "toy-shapes": (shapes_train, shapes_grammar),
        "toy-motion": (motion_train, motion_grammar),
    }[kind]
    examples = model_example_prompts(str(ASSETS / kind))
    assert examples == train.EXAMPLE_PROMPTS and len(examples) >= 2
    for prompt in examples:
        grammar.parse_prompt(prompt)  # raises ValueError outside the grammar
