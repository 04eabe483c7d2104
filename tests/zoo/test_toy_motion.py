"""toy-motion's grammar, checker and training objective, and its trainer end to end on a
tiny budget."""

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
    assert (
        len(scenes)
        == len(COLOURS) * (len(COLOURS) - 1) * len(SHAPES) * len(DIRECTIONS)
        == 1120
    )
    rng = random.Random(0)
    sample = rng.sample(scenes, 40)
    for scene in sample:
        assert parse_prompt(scene.prompt) == scene
    card = score((scene, draw_clip(scene, rng)) for scene in sample)
    assert card.rates() == {
        "background": 1.0,
        "colour": 1.0,
        "direction": 1.0,
        "shape": 1.0,
    }


def test_the_whole_shape_stays_inside_every_frame() -> None:
    """The largest shape at the extremes of its path and jitters never touches the
    frame's border (a clipped shape would read as another one)."""
    import numpy as np

    from diffserve.zoo.toy_motion import grammar

    rng = random.Random(3)
    for scene in rng.sample(all_scenes(), 60):
        clip = draw_clip(scene, rng)
        for frame in (clip[0], clip[-1]):
            pixels = np.asarray(frame)
            border = np.concatenate(
                [pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]]
            )
            assert (border == border[0]).all(), scene.prompt
    # The extremes by construction: the centre's farthest reach plus the largest radius.
    reach = (
        grammar.SIZE / 2
        + grammar.TRAVEL[1] / 2
        + grammar._START_JITTER
        + grammar.RADIUS[1]
    )
    assert (
        reach < grammar.SIZE
        and grammar.SIZE / 2 + grammar._CROSS_JITTER + grammar.RADIUS[1] < grammar.SIZE
    )


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
        # + </s>.
        assert len(tokenizer(scene.prompt).input_ids) == len(scene.prompt.split()) + 1


def test_the_compressed_prompt_attends_exactly_like_the_padded_one() -> None:
    """Training folds WanPipeline's 512-position zero padding into one biased slot: the
    same transformer output."""
    import torch
    from diffusers import WanTransformer3DModel

    from diffserve.zoo.toy_motion.wan_flow import (
        TEXT_LENGTH,
        bias_cross_attention,
        compress_prompts,
    )
    from diffserve.zoo.wan_specs import transformer_config

    torch.manual_seed(0)
    model = WanTransformer3DModel(
        **transformer_config(layers=1, heads=2, head_dim=24, ffn=32)
    ).eval()
    lengths = [10, 3]
    hidden = torch.randn(2, 10, 32)
    padded = torch.zeros(2, TEXT_LENGTH, 32)
    for row, n in enumerate(lengths):
        padded[row, :n] = hidden[row, :n]
    x, t = torch.randn(2, 16, 2, 4, 4), torch.tensor([900.0, 200.0])
    with torch.no_grad():
        want = model(
            hidden_states=x, timestep=t, encoder_hidden_states=padded, return_dict=False
        )[0]
        text = compress_prompts(hidden, lengths)
        for processor in bias_cross_attention(model):
            processor.bias = text.bias
        got = model(
            hidden_states=x,
            timestep=t,
            encoder_hidden_states=text.embeds,
            return_dict=False,
        )[0]
    assert text.embeds.shape == (2, 11, 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_text_encoder_tells_the_objects_colour_from_the_backgrounds(
    tmp_path: Path,
) -> None:
    """Cross-attention has no positions, so a word's role must be in its encoding: with
    the neighbour heads "red" as the object's colour and as the background's encode
    apart; a random UMT5 encodes them alike."""
    import torch

    from diffserve.zoo.toy_motion.text import (
        attend_to_neighbours,
        build_text_encoder,
        encode_prompts,
    )
    from diffserve.zoo.wan_specs import get_wan_spec

    prompts = [
        "a red circle moving left on a blue background",
        "a blue circle moving left on a red background",
        "a red square moving up on a green background",
    ]
    encoder = build_text_encoder(
        tmp_path, get_wan_spec("tiny-wan").text_encoder, seed=0
    )

    def similarities() -> tuple[float, float]:
        # Words 1 and 7: the two colours.
        embeds = encode_prompts(tmp_path, encoder, prompts).embeds

        def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
            return float(torch.nn.functional.cosine_similarity(a, b, dim=0))

        return cosine(embeds[0, 1], embeds[1, 7]), cosine(embeds[0, 1], embeds[2, 1])

    across_roles, same_role = similarities()
    assert across_roles < 0.6 and same_role > across_roles + 0.15, (
        across_roles,
        same_role,
    )
    # The same encoder without the neighbour heads: a bag of words.
    with torch.no_grad():
        for block in encoder.encoder.block:
            block.layer[0].SelfAttention.relative_attention_bias.weight.zero_()
    assert similarities()[0] > 0.95
    attend_to_neighbours(encoder)
    assert similarities()[0] == pytest.approx(across_roles)


def test_training_runs_end_to_end_on_a_tiny_budget(tmp_path: Path) -> None:
    """The trainer's every stage on a few steps (the real budget is ~40 minutes): a
    pipeline plain diffusers runs."""
    import torch
    from diffusers import WanPipeline

    from diffserve.zoo.toy_motion.train import (
        TrainConfig,
        best_guidance,
        train_toy_motion,
    )

    threads = torch.get_num_threads()
    try:
        out = train_toy_motion(
            tmp_path / "toy",
            TrainConfig(
                clips=16,
                vae_steps=2,
                vae_full_steps=1,
                vae_batch=2,
                temporal_vae_steps=1,
                temporal_vae_batch=1,
                transformer_steps=2,
                transformer_batch=4,
                frame_batch=4,
                eval_pairs=2,
                vae_check_clips=2,
                threads=1,
            ),
        )
    finally:
        torch.set_num_threads(threads)
    for name in (
        "loss.png",
        "training.json",
        "diffserve_model.json",
        "vae/config.json",
        "tokenizer/tokenizer.json",
        "transformer/diffusion_pytorch_model.safetensors",
        "text_encoder/model.safetensors",
    ):
        assert (out / name).is_file(), name
    defaults = json.loads((out / "diffserve_model.json").read_text())[
        "request_defaults"
    ]
    assert (defaults["num_frames"], defaults["height"], defaults["width"]) == (
        FRAMES,
        64,
        64,
    )
    assert (
        json.loads((out / "vae/config.json").read_text())["scale_factor_temporal"] == 4
    )
    # the checker's figures beside the weights (two pairs here: the path, not the
    # quality)
    summary = json.loads((out / "training.json").read_text())
    assert set(summary["checker"]) == {"guidance 1", "guidance 3"}
    # the request default guidance: the measured better of the two, written into the
    # marker
    assert (
        defaults["guidance_scale"]
        == summary["default_guidance"]
        == best_guidance(summary["checker"])
    )
    # The generated videos and the VAE's ceiling.
    rates = [*summary["checker"].values(), summary["vae_checker"]]
    assert all(
        set(r) == {"background", "colour", "direction", "shape"}
        and all(0 <= v <= 1 for v in r.values())
        for r in rates
    )
    video = WanPipeline.from_pretrained(str(out))(
        "a red ring moving up on a white background",
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=1,
        guidance_scale=1.0,
        output_type="np",
    ).frames
    assert video.shape == (1, 9, 64, 64, 3)


def test_the_per_frame_vae_encodes_each_frame_alone_and_its_twin_agrees() -> None:
    """The trainer's VAE: with the earlier-frame taps zero, a whole clip encodes as its
    frames one by one; the one-tap twin (training and encoding) computes the same
    latents, and leaving it restores the full taps with what the twin learned."""
    import torch
    from diffusers import AutoencoderKLWan

    from diffserve.zoo.toy_motion.vae import (
        VAE_CONFIG,
        per_frame_twin,
        zero_earlier_frame_taps,
    )

    torch.manual_seed(0)
    vae = AutoencoderKLWan(**VAE_CONFIG)
    zero_earlier_frame_taps(vae)
    clip = torch.rand(1, 3, 9, 32, 32) * 2 - 1
    with torch.no_grad():
        whole = vae.encode(clip).latent_dist.mean
        frames = torch.cat(
            [vae.encode(clip[:, :, i : i + 1]).latent_dist.mean for i in range(9)],
            dim=2,
        )
        assert whole.shape[2] == 9 and torch.allclose(whole, frames, atol=1e-5)
        with per_frame_twin(vae):
            twin = vae.encode(
                clip.transpose(1, 2).reshape(9, 3, 1, 32, 32)
            ).latent_dist.mean
            # What training inside the twin would change.
            for parameter in vae.parameters():
                parameter.add_(0.01)
        assert torch.allclose(
            twin.reshape(1, 9, *twin.shape[1:2], *twin.shape[3:]).transpose(1, 2),
            whole,
            atol=1e-5,
        )
        taps = [
            m.weight
            for m in vae.modules()
            if type(m).__name__ == "WanCausalConv3d" and m.weight.shape[2] > 1
        ]
        assert taps and all(w.shape[2] == 3 and not w[:, :, :-1].any() for w in taps)
        # The change came back with the taps.
        assert not torch.allclose(vae.encode(clip).latent_dist.mean, whole)


def test_the_inflated_vae_starts_as_the_per_frame_one_on_a_still_clip() -> None:
    """Inflating to 4x temporal compression keeps every per-frame weight and makes each
    ``time_conv`` pass the current frame through: a still clip encodes to 5 latent
    frames, each the per-frame VAE's latent of that frame, and decodes to 17 frames,
    each the per-frame VAE's reconstruction; a moving clip is where stage 2 has to
    learn."""
    import torch
    from diffusers import AutoencoderKLWan

    from diffserve.zoo.toy_motion.vae import (
        VAE_CONFIG,
        inflate_to_temporal,
        zero_earlier_frame_taps,
    )

    torch.manual_seed(0)
    per_frame = AutoencoderKLWan(**VAE_CONFIG).eval()
    zero_earlier_frame_taps(per_frame)
    inflated = inflate_to_temporal(per_frame).eval()
    frame = torch.rand(1, 3, 1, 32, 32) * 2 - 1
    still = frame.repeat(1, 1, FRAMES, 1, 1)
    with torch.no_grad():
        want_latent = per_frame.encode(frame).latent_dist.mean
        latents = inflated.encode(still).latent_dist.mean
        assert latents.shape == (1, 16, 5, 4, 4)
        torch.testing.assert_close(
            latents, want_latent.expand_as(latents), atol=1e-4, rtol=1e-4
        )
        want_frame = per_frame.decode(want_latent).sample
        video = inflated.decode(latents).sample
    assert video.shape == (1, 3, FRAMES, 32, 32)
    torch.testing.assert_close(video, want_frame.expand_as(video), atol=1e-4, rtol=1e-4)
    assert (
        inflated.config.scale_factor_temporal == 4
        and per_frame.config.scale_factor_temporal == 1
    )


def test_make_model_copies_the_shipped_toy_motion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --train make-model copies the shipped weights (every file); --train
    belongs to the trained kinds."""
    from diffserve.entrypoints.cli import main
    from diffserve.zoo.wan import toy_motion_dir

    assert main(["make-model", "toy-motion", str(tmp_path / "m")]) == 0
    shipped = toy_motion_dir()
    copied = sorted(
        p.relative_to(tmp_path / "m")
        for p in (tmp_path / "m").rglob("*")
        if p.is_file()
    )
    assert copied == sorted(
        p.relative_to(shipped) for p in shipped.rglob("*") if p.is_file()
    )
    assert main(["make-model", "tiny-wan", str(tmp_path / "w"), "--train"]) == 1
    assert "toy-motion only, not to tiny-wan" in capsys.readouterr().err


def test_the_default_guidance_is_the_one_farthest_above_the_bars() -> None:
    from diffserve.zoo.toy_motion.train import best_guidance

    good = {"background": 1.0, "colour": 0.95, "direction": 0.97, "shape": 0.70}
    assert (
        best_guidance({"guidance 1": good, "guidance 3": {**good, "shape": 0.65}})
        == 1.0
    )
    # more shape, but colour below its bar: the smallest margin decides
    assert (
        best_guidance(
            {"guidance 1": good, "guidance 3": {**good, "shape": 0.9, "colour": 0.8}}
        )
        == 1.0
    )
    assert (
        best_guidance(
            {"guidance 1": {**good, "shape": 0.4}, "guidance 3": {**good, "shape": 0.5}}
        )
        == 3.0
    )
