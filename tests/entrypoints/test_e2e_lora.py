"""LoRA over HTTP and from the CLI: the ``openai`` client's ``extra_body={"loras":
[...]}`` against a real ``diffserve serve --lora name=path``, 400s naming ``loras`` (the
server keeps serving), the attestation, and ``diffserve generate --lora FILE:SCALE``."""

from __future__ import annotations

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
    ) as server:
        yield openai.OpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120
        )


def generate(client, **extra):
    return client.images.generate(
        model="tiny-flux",
        prompt="a red fox",
        size="64x64",
        extra_body={**BODY, **extra},
    )


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
