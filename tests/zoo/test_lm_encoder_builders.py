"""The hermetic builders of families whose text encoder is a language model
(tiny-qwen-image: Qwen2.5-VL; tiny-z-image and tiny-flux2-klein: Qwen3 through its chat
template): plain diffusers loads and runs what they write, the locally made Qwen2
tokenizer puts Qwen-Image's system prompt on exactly the tokens its pipeline drops, and
a rebuild in another process is byte for byte the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tree_files import tree_files

WEIGHTS = {
    "transformer/diffusion_pytorch_model.safetensors",
    "vae/diffusion_pytorch_model.safetensors",
    "text_encoder/model.safetensors",
}
KINDS = {
    "tiny-qwen-image": "tiny_qwen_image_dir",
    "tiny-qwen-image-edit": "tiny_qwen_image_edit_dir",
    "tiny-qwen-image-edit-plus": "tiny_qwen_image_edit_plus_dir",
    "tiny-z-image": "tiny_z_image_dir",
    "tiny-flux2-klein": "tiny_flux2_klein_dir",
    "tiny-flux2": "tiny_flux2_dir",
}


def test_plain_diffusers_loads_and_runs_it(tiny_qwen_image_dir: Path) -> None:
    import numpy as np
    import torch
    from diffusers import QwenImagePipeline

    index = json.loads((tiny_qwen_image_dir / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImagePipeline"
    assert index["text_encoder"] == [
        "transformers",
        "Qwen2_5_VLForConditionalGeneration",
    ]
    assert index["tokenizer"] == ["transformers", "Qwen2Tokenizer"]
    assert index["vae"] == ["diffusers", "AutoencoderKLQwenImage"]
    pipe = QwenImagePipeline.from_pretrained(tiny_qwen_image_dir)
    pipe.set_progress_bar_config(disable=True)
    text = pipe.text_encoder.config.text_config
    assert text.hidden_size == pipe.transformer.config.joint_attention_dim
    assert (
        sum(pipe.transformer.config.axes_dims_rope)
        == pipe.transformer.config.attention_head_dim
    )
    assert (pipe.vae_scale_factor, pipe.scheduler.config.time_shift_type) == (
        8,
        "exponential",
    )
    out = pipe(
        "a red fox",
        negative_prompt=" ",
        height=64,
        width=48,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    assert out.images.shape == (1, 64, 48, 3)
    assert np.isfinite(out.images).all() and out.images.std() > 0


def test_the_system_prompt_is_exactly_what_the_pipeline_drops(
    tiny_qwen_image_dir: Path,
) -> None:
    from diffusers import QwenImagePipeline
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen_image_dir / "tokenizer"))
    pipe = QwenImagePipeline.from_pretrained(tiny_qwen_image_dir)
    template, drop = pipe.prompt_template_encode, pipe.prompt_template_encode_start_idx
    ids = tokenizer(template.format("a red fox")).input_ids
    tokens = tokenizer.convert_ids_to_tokens(ids)
    # What is left after the pipeline drops its 34 tokens starts with the user's prompt,
    # as with Qwen's own tokenizer: every word of the template is one token.
    assert tokens[drop : drop + 3] == ["a", "Ġred", "Ġfox"]
    assert tokens[drop - 2 : drop] == ["user", "Ċ"] and tokens[0] == "<|im_start|>"
    # The text encoder's special ids are the tokenizer's.
    config = pipe.text_encoder.config
    assert config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert config.vision_start_token_id == tokenizer.convert_tokens_to_ids(
        "<|vision_start|>"
    )
    assert config.text_config.vocab_size == len(tokenizer)


def test_z_image_reads_qwen3_through_its_chat_template(tiny_z_image_dir: Path) -> None:
    import numpy as np
    import torch
    from diffusers import ZImagePipeline

    index = json.loads((tiny_z_image_dir / "model_index.json").read_text())
    assert (index["_class_name"], index["text_encoder"]) == (
        "ZImagePipeline",
        ["transformers", "Qwen3Model"],
    )
    pipe = ZImagePipeline.from_pretrained(tiny_z_image_dir)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.text_encoder.config.hidden_size == pipe.transformer.config.cap_feat_dim
    chat = pipe.tokenizer.apply_chat_template(
        [{"role": "user", "content": "a red fox"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=True,
    )
    assert chat == "<|im_start|>user\na red fox<|im_end|>\n<|im_start|>assistant\n"
    tokens = pipe.tokenizer.convert_ids_to_tokens(pipe.tokenizer(chat).input_ids)
    assert tokens[:5] == ["<|im_start|>", "user", "Ċ", "a", "Ġred"]
    no_thinking = pipe.tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert no_thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    out = pipe(
        "a red fox",
        height=64,
        width=48,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    assert out.images.shape == (1, 64, 48, 3)
    assert np.isfinite(out.images).all() and out.images.std() > 0


def test_flux2_klein_stacks_three_hidden_states_of_a_deep_enough_encoder(
    tiny_flux2_klein_dir: Path,
) -> None:
    import numpy as np
    import torch
    from diffusers import Flux2KleinPipeline

    index = json.loads((tiny_flux2_klein_dir / "model_index.json").read_text())
    assert (
        index["text_encoder"] == ["transformers", "Qwen3ForCausalLM"]
        and index["is_distilled"] is False
    )
    assert index["vae"] == ["diffusers", "AutoencoderKLFlux2"]
    pipe = Flux2KleinPipeline.from_pretrained(tiny_flux2_klein_dir)
    pipe.set_progress_bar_config(disable=True)
    # Hidden states 9, 18 and 27 exist and stack into the transformer's text width.
    text = pipe.text_encoder.config
    assert text.num_hidden_layers >= 27
    assert pipe.transformer.config.joint_attention_dim == 3 * text.hidden_size
    # 2x2 latent patches.
    assert pipe.transformer.config.in_channels == 4 * pipe.vae.config.latent_channels
    out = pipe(
        prompt="a red fox",
        height=64,
        width=32,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    assert out.images.shape == (1, 64, 32, 3)
    assert np.isfinite(out.images).all() and out.images.std() > 0


def test_flux2_dev_reads_mistral3_through_its_processors_chat_template(
    tiny_flux2_dir: Path,
) -> None:
    import numpy as np
    import torch
    from diffusers import Flux2Pipeline

    from diffserve.models.generic.vl_processor import processor_components

    index = json.loads((tiny_flux2_dir / "model_index.json").read_text())
    assert index["text_encoder"] == ["transformers", "Mistral3ForConditionalGeneration"]
    assert index["tokenizer"] == ["transformers", "PixtralProcessor"]
    # The processor, or its tokenizer without torchvision.
    processors = processor_components(tiny_flux2_dir)
    pipe = Flux2Pipeline.from_pretrained(tiny_flux2_dir, **dict.fromkeys(processors))
    pipe.register_modules(**processors)
    pipe.set_progress_bar_config(disable=True)
    text = pipe.text_encoder.config.text_config
    assert (
        text.num_hidden_layers >= 30
        and pipe.transformer.config.joint_attention_dim == 3 * text.hidden_size
    )
    assert pipe.transformer.config.guidance_embeds  # FLUX.2-dev's guidance is distilled
    messages = [
        [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": [{"type": "text", "text": "a red fox"}]},
        ]
    ]
    assert pipe.tokenizer.apply_chat_template(messages, tokenize=False) == [
        "<s>[SYSTEM_PROMPT]be brief[/SYSTEM_PROMPT][INST]a red fox[/INST]"
    ]
    out = pipe(
        prompt="a red fox",
        height=32,
        width=64,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    assert out.images.shape == (1, 32, 64, 3)
    assert np.isfinite(out.images).all() and out.images.std() > 0


@pytest.fixture(scope="module")
def cli_rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every kind rebuilt by ``diffserve make-model`` in one other process (another hash
    seed than the fixtures' builder; one interpreter start for the six, ~3 CPU-s each
    saved)."""
    import os
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("rebuilt")
    script = (
        "import sys\nfrom diffserve.entrypoints.cli import main\n"
        "sys.exit(max(main(['make-model', kind, sys.argv[1] "
        "+ '/' + kind]) for kind in sys.argv[2:]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root), *KINDS],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(root / kind) for kind in KINDS]
    return root


@pytest.mark.parametrize("kind", list(KINDS))
def test_cli_rebuild_is_byte_identical_and_safetensors_only(
    cli_rebuilt: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    built, fixture = (
        tree_files(cli_rebuilt / kind),
        tree_files(request.getfixturevalue(KINDS[kind])),
    )
    assert sorted(built) == sorted(fixture)
    assert [name for name in built if built[name] != fixture[name]] == []
    assert {f for f in built if f.endswith(".safetensors")} == WEIGHTS
    assert not [
        f for f in built if f.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl"))
    ]
    assert json.loads(built["diffserve_model.json"])["random_weights"] is True
