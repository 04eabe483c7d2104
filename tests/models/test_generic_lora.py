"""Per-request LoRA on the generic path (models/generic/lora.py), on Qwen-Image: a
diffusers/PEFT adapter applied unmerged through our Linear matches plain diffusers'
``load_lora_weights`` + ``set_adapters``, the base image is unchanged after adapter
requests, the attestation names the adapter, and a file that does not fit is refused at
admission."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_generic_pipeline import build, diffusers_image, make_request, psnr

from diffserve import Engine, GenerationRequest
from diffserve.errors import RequestError
from diffserve.models.base import library_admit
from diffserve.models.generic.lora import denoiser_linear_shapes

TARGETS = (
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_k_proj",
    "img_mlp.net.2",
    "txt_mod.1",
)


def write_lora(
    model_dir: Path, out: Path, *, rank: int = 4, seed: int = 0, strength: float = 2.0
) -> Path:
    """A random diffusers/PEFT LoRA for the model's transformer blocks (strong enough to
    change the image)."""
    from safetensors.torch import save_file

    shapes = denoiser_linear_shapes(model_dir / "transformer")
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (out_features, in_features) in sorted(shapes.items()):
        if not module.startswith("transformer_blocks.") or not module.endswith(TARGETS):
            continue
        tensors[f"transformer.{module}.lora_A.weight"] = (
            torch.randn(rank, in_features, generator=generator) / in_features**0.5
        )
        tensors[f"transformer.{module}.lora_B.weight"] = (
            torch.randn(out_features, rank, generator=generator) * strength / rank**0.5
        )
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "pytorch_lora_weights.safetensors"))
    return out / "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def qwen_lora(
    tiny_qwen_image_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return write_lora(tiny_qwen_image_dir, tmp_path_factory.mktemp("qwen-lora"))


def _diffusers_with_lora(model_dir: Path, lora: Path, scale: float) -> np.ndarray:
    import diffusers

    pipe = diffusers.QwenImagePipeline.from_pretrained(
        str(model_dir), torch_dtype=torch.float32
    )
    pipe.set_progress_bar_config(disable=True)
    pipe.load_lora_weights(str(lora), adapter_name="style")
    pipe.set_adapters(["style"], [scale])
    image = pipe(
        prompt="a red fox in the snow",
        negative_prompt=" ",
        height=64,
        width=64,
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(5),
        output_type="np",
    ).images[0]
    return (image * 255).round()


def test_adapter_matches_diffusers_and_leaves_the_base_unchanged(
    tiny_qwen_image_dir: Path, qwen_lora: Path
) -> None:
    pipe = build(tiny_qwen_image_dir, lora_modules=f"style={qwen_lora}")
    assert pipe.capabilities.lora
    base_before = pipe(make_request()).images[0].numpy()
    pipe.kernel_counters.reset()
    adapted = pipe(library_admit(pipe, make_request(loras=(("style", 0.8),))))
    ours = adapted.images[0].numpy()
    assert psnr(ours, _diffusers_with_lora(tiny_qwen_image_dir, qwen_lora, 0.8)) >= 40.0
    assert psnr(ours, base_before) < 40.0  # the adapter really changed the image
    assert adapted.attestation["lora"] == {
        "adapters": [{"name": "style", "scale": 0.8}]
    }
    assert pipe.kernel_counters.snapshot().get("lora_linear_calls", 0) > 0
    # The base weights were never touched: a plain request after it is the plain image,
    # bit for bit, and equals plain diffusers.
    assert np.array_equal(pipe(make_request()).images[0].numpy(), base_before)
    assert (
        psnr(
            base_before,
            diffusers_image(
                tiny_qwen_image_dir, "QwenImagePipeline", torch.float32, seed=5
            ),
        )
        >= 60.0
    )


def test_through_the_engine_a_file_that_does_not_fit_is_refused_and_a_good_one_attested(
    tiny_qwen_image_dir: Path, qwen_lora: Path, tmp_path: Path
) -> None:
    from safetensors.torch import save_file

    # An adapter for a deeper model: block 7 does not exist here.
    (tmp_path / "other").mkdir()
    save_file(
        {
            "transformer.transformer_blocks.7.attn.to_q.lora_A.weight": torch.zeros(
                4, 128
            ),
            "transformer.transformer_blocks.7.attn.to_q.lora_B.weight": torch.zeros(
                128, 4
            ),
        },
        str(tmp_path / "other" / "pytorch_lora_weights.safetensors"),
    )
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "style.safetensors").write_bytes(qwen_lora.read_bytes())
    request = {
        "prompt": "a fox",
        "height": 32,
        "width": 32,
        "num_inference_steps": 2,
        "seed": 1,
    }
    with Engine(
        str(tiny_qwen_image_dir),
        dtype="float32",
        enforce_eager=True,
        lora_dir=str(tmp_path),
        env={},
    ) as engine:
        with pytest.raises(RequestError, match="match no Linear of this model") as info:
            engine.generate(
                GenerationRequest(
                    **request, loras=(("other/pytorch_lora_weights.safetensors", 1.0),)
                )
            )
        assert info.value.param == "loras"
        with pytest.raises(RequestError, match="unknown LoRA adapter"):
            engine.generate(
                GenerationRequest(**request, loras=(("nope.safetensors", 1.0),))
            )
        out = engine.generate(
            GenerationRequest(**request, loras=(("qwen/style.safetensors", 0.5),))
        )
        assert out.attestation["lora"] == {
            "adapters": [{"name": "qwen/style.safetensors", "scale": 0.5}]
        }
        assert out.attestation["lora_linear_calls"] > 0


def test_families_without_adapters_refuse_them(tiny_z_image_dir: Path) -> None:
    with Engine(
        str(tiny_z_image_dir), dtype="float32", enforce_eager=True, env={}
    ) as engine:
        assert not engine.capabilities.lora
        with pytest.raises(RequestError, match="does not apply LoRA adapters"):
            engine.generate(
                GenerationRequest(
                    prompt="x",
                    height=32,
                    width=32,
                    num_inference_steps=2,
                    loras=(("style", 1.0),),
                )
            )


def test_adapters_and_first_block_cache_together(
    tiny_qwen_image_dir: Path, qwen_lora: Path
) -> None:
    # The step cache wraps the blocks after the adapters found their layers: both apply,
    # and threshold 0 is the adapted image bit for bit.
    plain = build(tiny_qwen_image_dir, lora_modules=f"style={qwen_lora}")
    cached = build(
        tiny_qwen_image_dir,
        lora_modules=f"style={qwen_lora}",
        cache={"backend": "fbcache"},
    )
    request = make_request(loras=(("style", 0.8),), num_inference_steps=4)
    adapted = plain(request).images[0].numpy()
    assert np.array_equal(
        cached(
            make_request(
                loras=(("style", 0.8),), num_inference_steps=4, cache_threshold=0.0
            )
        )
        .images[0]
        .numpy(),
        adapted,
    )
    skipping = cached(
        make_request(
            loras=(("style", 0.8),), num_inference_steps=4, cache_threshold=1.0
        )
    )
    assert skipping.attestation["cache"][0]["skipped_steps"] >= 1
    assert skipping.attestation["lora"] == {
        "adapters": [{"name": "style", "scale": 0.8}]
    }
