"""toy-motion's grammar, checker and training objective, and its trainer end to end on a tiny budget."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from diffserve.zoo.toy_motion.checker import direction_of, read_clip, score
from diffserve.zoo.toy_motion.grammar import (
    DIRECTIONS,
    FRAMES,
    all_scenes,
    draw_clip,
    grammar_corpus,
    parse_prompt,
)
from diffserve.zoo.toy_shapes.grammar import COLOURS, SHAPES


def test_the_grammar_and_its_checker_agree_on_drawn_clips() -> None:
    scenes = all_scenes()
    assert len(scenes) == len(COLOURS) * (len(COLOURS) - 1) * len(SHAPES) * len(DIRECTIONS) == 1120
    rng = random.Random(0)
    sample = rng.sample(scenes, 40)
    for scene in sample:
        assert parse_prompt(scene.prompt) == scene
    card = score((scene, draw_clip(scene, rng)) for scene in sample)
    assert card.rates() == {"background": 1.0, "colour": 1.0, "direction": 1.0, "shape": 1.0}


def test_a_clip_that_does_not_move_has_no_direction() -> None:
    scene = parse_prompt("a red square moving left on a blue background")
    still = [draw_clip(scene, random.Random(1))[0]] * FRAMES
    assert read_clip(still).scene.direction == "none"
    assert direction_of([None] * FRAMES) == "none"
    with pytest.raises(ValueError, match="not a toy-motion prompt"):
        parse_prompt("a red square on a blue background")


def test_every_grammar_word_is_one_token(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from diffserve.zoo.tokenizers import write_t5_tokenizer

    write_t5_tokenizer(tmp_path, grammar_corpus())
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    for scene in all_scenes()[::37]:
        assert len(tokenizer(scene.prompt).input_ids) == len(scene.prompt.split()) + 1  # + </s>


def test_the_compressed_prompt_attends_exactly_like_the_padded_one() -> None:
    """Training folds WanPipeline's 512-position zero padding into one biased slot: the same transformer output."""
    import torch
    from diffusers import WanTransformer3DModel

    from diffserve.zoo.toy_motion.wan_flow import TEXT_LENGTH, bias_cross_attention, compress_prompts
    from diffserve.zoo.wan_specs import transformer_config

    torch.manual_seed(0)
    model = WanTransformer3DModel(**transformer_config(layers=1, heads=2, head_dim=24, ffn=32)).eval()
    lengths = [10, 3]
    hidden = torch.randn(2, 10, 32)
    padded = torch.zeros(2, TEXT_LENGTH, 32)
    for row, n in enumerate(lengths):
        padded[row, :n] = hidden[row, :n]
    x, t = torch.randn(2, 16, 2, 4, 4), torch.tensor([900.0, 200.0])
    with torch.no_grad():
        want = model(hidden_states=x, timestep=t, encoder_hidden_states=padded, return_dict=False)[0]
        text = compress_prompts(hidden, lengths)
        for processor in bias_cross_attention(model):
            processor.bias = text.bias
        got = model(hidden_states=x, timestep=t, encoder_hidden_states=text.embeds, return_dict=False)[0]
    assert text.embeds.shape == (2, 11, 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_training_runs_end_to_end_on_a_tiny_budget(tmp_path: Path) -> None:
    """The trainer's every stage on a few steps (the real budget is ~35 minutes): a pipeline plain diffusers runs."""
    import torch
    from diffusers import WanPipeline

    from diffserve.zoo.toy_motion.train import TrainConfig, train_toy_motion

    threads = torch.get_num_threads()
    try:
        out = train_toy_motion(tmp_path / "toy", TrainConfig(clips=16, vae_steps=2, vae_full_steps=1, vae_batch=2,
                                                             transformer_steps=2, transformer_batch=4, threads=1))
    finally:
        torch.set_num_threads(threads)
    for name in ("loss.png", "training.json", "diffserve_model.json", "vae/config.json", "tokenizer/tokenizer.json",
                 "transformer/diffusion_pytorch_model.safetensors", "text_encoder/model.safetensors"):
        assert (out / name).is_file(), name
    defaults = json.loads((out / "diffserve_model.json").read_text())["request_defaults"]
    assert (defaults["num_frames"], defaults["height"], defaults["width"]) == (FRAMES, 64, 64)
    video = WanPipeline.from_pretrained(str(out))("a red ring moving up on a white background", height=64, width=64,
                                                  num_frames=5, num_inference_steps=1, guidance_scale=1.0,
                                                  output_type="np").frames
    assert video.shape == (1, 5, 64, 64, 3)
