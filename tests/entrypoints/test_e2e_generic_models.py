"""The generic path over HTTP and from the CLI: ``diffserve serve`` and ``generate`` on
tiny SD3 (and PixArt-Sigma) with the same API as FLUX: the official ``openai`` client,
sizes checked against the model's VAE factor x patch size, the model's own defaults, the
attestation of what ran. The families share one server (a deploy file's ``models:``
list), each on its own engine, as a user serving several models would."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image
from test_e2e_generate_cli import run_cli, run_in_process

pytestmark = pytest.mark.e2e


# The generic families on one server (a deploy file's models: list; each its own engine
# and config), float32, torch/sdpa kernels, eager: one server start for the module, not
# one per family.
GENERIC_MODELS = {
    "tiny-sd3": "tiny_sd3_dir",
    "tiny-qwen-image": "tiny_qwen_image_dir",
    "tiny-z-image": "tiny_z_image_dir",
    "tiny-flux2-klein": "tiny_flux2_klein_dir",
    "tiny-flux2": "tiny_flux2_dir",
    "tiny-qwen-image-edit": "tiny_qwen_image_edit_dir",
    "tiny-qwen-image-21": "tiny_qwen_image21_dir",
}


def generated(client, name: str, size: str, **extra) -> tuple[Image.Image, dict]:
    """One image of ``size`` (2 steps, seed 3 unless ``extra`` says otherwise) and its
    attestation."""
    result = client.images.generate(
        model=name,
        prompt="a red fox",
        size=size,
        extra_body={"num_inference_steps": 2, "seed": 3, **extra},
    )
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    return image, result.model_extra["diffserve"]["attestation"]


@pytest.fixture(scope="module")
def client(server_launcher, write_deploy, request):
    entries = "".join(
        f"""
  - model: {request.getfixturevalue(fixture)}
    name: {name}
    distributed_executor_backend: uni
    enforce_eager: true
    dtype: float32
    linear_backend: torch"""
        for name, fixture in GENERIC_MODELS.items()
    )
    with server_launcher(
        "--deploy-config", write_deploy(f"models:{entries}\n")
    ) as server:
        yield openai.OpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=180
        )


def test_openai_client_generates_on_sd3(client) -> None:
    result = client.images.generate(
        model="tiny-sd3",
        prompt="a red fox",
        size="64x48",
        n=2,
        extra_body={"num_inference_steps": 2, "seed": 7},
    )
    assert len(result.data) == 2
    for item in result.data:
        assert Image.open(io.BytesIO(base64.b64decode(item.b64_json))).size == (64, 48)
    info = result.model_extra["diffserve"]
    assert info["seeds"] == [7, 8]
    attestation = info["attestation"]
    assert attestation["implementation"] == "generic"
    assert attestation["model_family"] == "StableDiffusion3Pipeline"
    assert (
        attestation["linear"]["torch"] > 0
        and sum(attestation["attention"].values()) > 0
    )
    assert attestation["transformer_forwards"] == 2


def test_size_not_a_multiple_of_the_patch_grid_is_a_400_and_serving_goes_on(
    client,
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.images.generate(
            model="tiny-sd3",
            prompt="x",
            size="72x64",
            extra_body={"num_inference_steps": 1},
        )
    assert info.value.body["param"] in ("size", "width")
    ok = client.images.generate(
        model="tiny-sd3",
        prompt="x",
        size="32x32",
        extra_body={"num_inference_steps": 1},
    )
    assert len(ok.data) == 1


def test_models_lists_the_generic_models(client) -> None:
    assert [m.id for m in client.models.list()] == list(GENERIC_MODELS)


def test_generate_cli_on_pixart(tiny_pixart_dir, tmp_path, capsys) -> None:
    out = tmp_path / "pixart.png"
    done = run_in_process(
        capsys,
        "generate",
        str(tiny_pixart_dir),
        "a blue square",
        "--size",
        "32x32",
        "--steps",
        "2",
        "--seed",
        "4",
        "--output",
        str(out),
        "--no-progress",
        "--dtype",
        "float32",
    )
    assert done.returncode == 0, done.stderr
    image = Image.open(out)
    assert image.size == (32, 32)
    assert image.info.get("steps") == "2"
    # PixArt-Sigma's own default guidance reached the request (source: model).
    assert image.info.get("guidance_scale") == "4.5"


def test_config_explain_names_the_generic_path(tiny_sd3_dir) -> None:
    done = run_cli("config", "explain", str(tiny_sd3_dir))
    assert done.returncode == 0, done.stderr
    rows = {
        line.split()[1]: line
        for line in done.stdout.splitlines()[2:]
        if len(line.split()) > 3
    }
    assert "generic" in rows["implementation"] and "model" in rows["implementation"]
    assert (
        " 7.0 " in rows["request_defaults.guidance_scale"]
        and "model" in rows["request_defaults.guidance_scale"]
    )
    assert " 28 " in rows["request_defaults.num_inference_steps"]


def test_openai_client_generates_on_qwen_image(client) -> None:
    model = client.models.retrieve("tiny-qwen-image")
    assert model.id == "tiny-qwen-image"
    # Qwen-Image's own defaults (its __call__'s: 1024 px, 50 steps, CFG 4.0), source
    # model.
    assert model.model_extra["diffserve"]["defaults"] == {
        "size": "1024x1024",
        "num_inference_steps": 50,
        "guidance_scale": 4.0,
    }
    image, attestation = generated(client, "tiny-qwen-image", "64x32")
    assert image.size == (64, 32)
    assert (
        attestation["model_family"] == "QwenImagePipeline"
        and attestation["implementation"] == "generic"
    )
    assert attestation["linear"]["torch"] > 0 and attestation["attention"]["sdpa"] > 0
    # The default CFG ran: two denoiser forwards a step (the prompt's and " "'s).
    assert attestation["transformer_forwards"] == 4
    # Its CFG scale is guidance_scale; a second scale with a negative prompt is a 400,
    # and serving goes on.
    with pytest.raises(openai.BadRequestError) as refused:
        generated(
            client,
            "tiny-qwen-image",
            "32x32",
            negative_prompt="dark",
            true_cfg_scale=3.0,
        )
    assert (
        refused.value.body["param"] == "true_cfg_scale"
        and "guidance_scale" in refused.value.body["message"]
    )
    assert (
        generated(client, "tiny-qwen-image", "32x32", guidance_scale=1.0)[1][
            "transformer_forwards"
        ]
        == 2
    )


def test_openai_client_generates_on_z_image(client) -> None:
    model = client.models.retrieve("tiny-z-image")
    assert model.model_extra["diffserve"]["defaults"] == {
        "size": "1024x1024",
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
    }
    image, attestation = generated(client, "tiny-z-image", "48x32")
    assert image.size == (48, 32)
    assert (
        attestation["model_family"] == "ZImagePipeline"
        and attestation["implementation"] == "generic"
    )
    assert (
        attestation["linear"]["torch"] > 0 and attestation["transformer_forwards"] == 2
    )
    # Its image refiner, text refiner and joint blocks: four attention calls a forward
    # on the tiny model.
    assert attestation["attention"] == {"sdpa": 8}
    # Sizes are multiples of 16 (VAE 8 x its 2x2 patches, packed outside the denoiser's
    # config).
    with pytest.raises(openai.BadRequestError) as refused:
        generated(client, "tiny-z-image", "40x32")
    assert refused.value.body["param"] in ("size", "width")


def test_openai_client_generates_on_flux2_klein(client) -> None:
    image, attestation = generated(client, "tiny-flux2-klein", "32x48")
    assert image.size == (32, 48)
    assert (
        attestation["model_family"] == "Flux2KleinPipeline"
        and attestation["implementation"] == "generic"
    )
    # Its default CFG 4.0: the prompt's and the empty prompt's forward each step; one
    # double and two single blocks each.
    assert attestation["transformer_forwards"] == 4 and attestation["attention"] == {
        "sdpa": 12
    }
    # Its pipeline takes no negative prompt: a 400 that says so, and serving goes on.
    with pytest.raises(openai.BadRequestError) as refused:
        generated(client, "tiny-flux2-klein", "32x32", negative_prompt="dark")
    assert refused.value.body["param"] == "negative_prompt"
    assert "no negative prompt" in refused.value.body["message"]
    assert (
        generated(client, "tiny-flux2-klein", "32x32", guidance_scale=1.0)[1][
            "transformer_forwards"
        ]
        == 2
    )


def test_openai_client_generates_on_flux2_dev(client) -> None:
    image, attestation = generated(client, "tiny-flux2", "64x32")
    assert image.size == (64, 32)
    assert (
        attestation["model_family"] == "Flux2Pipeline"
        and attestation["implementation"] == "generic"
    )
    # Distilled guidance: one forward a step, one double and two single blocks each.
    assert attestation["transformer_forwards"] == 2 and attestation["attention"] == {
        "sdpa": 6
    }
    assert attestation["linear"]["torch"] > 0


def test_openai_client_edits_on_qwen_image_edit(
    client, tiny_qwen_image_edit_dir, tmp_path, capsys
) -> None:
    source = Image.new("RGB", (48, 32), (30, 90, 200))
    buffer = io.BytesIO()
    source.save(buffer, format="PNG")

    def edit(image: bytes = buffer.getvalue(), **extra):
        return client.images.edit(
            model="tiny-qwen-image-edit",
            image=("in.png", image, "image/png"),
            prompt="make it red",
            extra_body={"num_inference_steps": 2, "seed": 3, **extra},
        )

    result = edit(guidance_scale=1.0)
    assert Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).size == (
        48,
        32,
    )
    attestation = result.model_extra["diffserve"]["attestation"]
    # Guidance 1: no CFG (the default's runs in
    # tests/models/test_generic_qwen_image.py), one forward a step.
    assert (
        attestation["model_family"] == "QwenImageEditPipeline"
        and attestation["transformer_forwards"] == 2
    )
    # The same upload checks as FLUX's edits: a file that is not an image is a 400, and
    # serving goes on.
    for bad, extra, param in (
        (b"not an image", {}, "image"),
        (buffer.getvalue(), {"strength": 0.5}, "strength"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            edit(bad, **extra)
        assert refused.value.body["param"] == param
    # And from the CLI: generate --image (in this process: the subprocess path is
    # test_e2e_generate_cli.py's).
    source.save(tmp_path / "in.png")
    out = tmp_path / "edited.png"
    done = run_in_process(
        capsys,
        "generate",
        str(tiny_qwen_image_edit_dir),
        "make it red",
        "--image",
        str(tmp_path / "in.png"),
        "--steps",
        "2",
        "--seed",
        "4",
        "--guidance-scale",
        "1",
        "--output",
        str(out),
        "--no-progress",
        "--dtype",
        "float32",
    )
    assert done.returncode == 0, done.stderr
    assert Image.open(out).size == (48, 32)


def test_openai_client_generates_rgba_on_qwen_image_21(client) -> None:
    # A prompt no other test sends: its first encoding is the conditioning cache's miss.
    prompt = "a glass teapot on a transparent background"
    steps = 3

    def generate(size: str = "64x32", **kwargs):
        kwargs.setdefault("extra_body", {"num_inference_steps": steps, "seed": 5})
        return client.images.generate(
            model="tiny-qwen-image-21", prompt=prompt, size=size, **kwargs
        )

    first = generate()
    image = Image.open(io.BytesIO(base64.b64decode(first.data[0].b64_json)))
    # Its VAE draws an alpha channel, kept by the PNG.
    assert image.format == "PNG" and image.mode == "RGBA" and image.size == (64, 32)
    # Not an opaque channel added on the way: the model's own (partly transparent).
    assert image.getchannel("A").getextrema()[0] < 255
    attestation = first.model_extra["diffserve"]["attestation"]
    assert (
        attestation["model_family"] == "QwenImage21Pipeline"
        and attestation["implementation"] == "generic"
    )
    # Its default guidance 1.0 (no CFG): the prompt's prefix is prefilled once and
    # read back at every later step.
    assert attestation["prefix_kv_cache"] == {
        "prefills": 1,
        "hits": steps - 1,
        "uncached": 0,
    }
    assert attestation["conditioning_cache"] == "miss"
    # The same request again: its text encodings come from the conditioning cache, and
    # the image is the same bytes.
    again = generate()
    repeat = again.model_extra["diffserve"]["attestation"]
    assert repeat["conditioning_cache"] == "hit", repeat
    state = repeat["conditioning_cache_state"]
    assert state["entries"] >= 1 and state["bytes"] > 0, state
    assert again.data[0].b64_json == first.data[0].b64_json
    # A request may skip the cache: encoded again, the same image.
    off = generate(
        extra_body={
            "num_inference_steps": steps,
            "seed": 5,
            "conditioning_cache": False,
        }
    )
    assert off.model_extra["diffserve"]["attestation"]["conditioning_cache"] == "off"
    assert off.data[0].b64_json == first.data[0].b64_json
    # JPEG has no alpha: an RGB image, the PNG composited over white (not its alpha
    # dropped, which shows the colour the transparent pixels hold).
    jpeg = Image.open(
        io.BytesIO(base64.b64decode(generate(output_format="jpeg").data[0].b64_json))
    )
    assert jpeg.format == "JPEG" and jpeg.mode == "RGB" and jpeg.size == (64, 32)
    pixels = np.asarray(image, dtype=np.float64)
    alpha = pixels[..., 3:] / 255
    over_white = pixels[..., :3] * alpha + 255 * (1 - alpha)
    dropped = pixels[..., :3]
    decoded = np.asarray(jpeg, dtype=np.float64)
    assert np.abs(decoded - over_white).mean() < 8
    assert np.abs(decoded - dropped).mean() > 4 * np.abs(decoded - over_white).mean()
    # Sizes are multiples of 32: 48x48 is a 400, and serving goes on.
    with pytest.raises(openai.BadRequestError) as refused:
        generate("48x48")
    assert refused.value.body["param"] in ("size", "width", "height"), (
        refused.value.body
    )
    assert "32" in refused.value.body["message"], refused.value.body
    after = generate("32x32")
    assert Image.open(io.BytesIO(base64.b64decode(after.data[0].b64_json))).size == (
        32,
        32,
    )
