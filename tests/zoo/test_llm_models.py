"""The small language models of the prompt-rewrite stage (diffserve.zoo.llm): the random
tiny-qwen3 and tiny-qwen3-moe load and decode in plain transformers and rebuild byte for
byte in another process, the MoE one routes over real experts, the expansion rule writes
prompts of the toy models' own grammars, and the shipped toy-prompter reproduces the
rule on prompts it never saw in training (transformers' greedy decoding)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from tree_files import tree_files

from diffserve.zoo.llm.prompt_grammar import (
    DEFAULT_BACKGROUND,
    SYSTEM_PROMPT,
    expand,
    held_out_pairs,
    parse_short,
    short_prompts,
    training_pairs,
)

KINDS = ("tiny-qwen3", "tiny-qwen3-moe")
FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "diffserve_model.json",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both random kinds, seed 0, built in this process."""
    from diffserve.zoo.llm.build import build_tiny_llm

    root = tmp_path_factory.mktemp("llm")
    return {kind: build_tiny_llm(kind, root / kind, seed=0) for kind in KINDS}


@pytest.fixture(scope="module")
def cli_rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both random kinds and the copied toy-prompter through ``diffserve make-model``,
    in one other process (another hash seed than this one's)."""
    root = tmp_path_factory.mktemp("rebuilt")
    script = (
        "import sys\nfrom diffserve.entrypoints.cli import main\n"
        "sys.exit(max(main(['make-model', kind, sys.argv[1] "
        "+ '/' + kind]) for kind in sys.argv[2:]))"
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONHASHSEED": "123",
    }
    proc = subprocess.run(
        [sys.executable, "-c", script, str(root), *KINDS, "toy-prompter"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        str(root / kind) for kind in (*KINDS, "toy-prompter")
    ]
    return root


@pytest.mark.parametrize("kind", KINDS)
def test_a_rebuild_in_another_process_is_byte_identical(
    built: dict[str, Path], cli_rebuilt: Path, kind: str
) -> None:
    here, there = tree_files(built[kind]), tree_files(cli_rebuilt / kind)
    assert set(here) == set(there) == FILES  # safetensors only, json included
    assert [name for name in here if here[name] != there[name]] == []
    marker = json.loads(here["diffserve_model.json"])
    assert (marker["kind"], marker["seed"], marker["random_weights"]) == (kind, 0, True)


def test_another_seed_changes_only_the_weights(
    built: dict[str, Path], tmp_path: Path
) -> None:
    from diffserve.zoo.llm.build import build_tiny_llm

    seed0, seed1 = (
        tree_files(built["tiny-qwen3"]),
        tree_files(build_tiny_llm("tiny-qwen3", tmp_path / "m", seed=1)),
    )
    assert sorted(name for name in seed0 if seed0[name] != seed1[name]) == [
        "diffserve_model.json",
        "model.safetensors",
    ]


def test_make_model_copies_the_shipped_toy_prompter(cli_rebuilt: Path) -> None:
    from diffserve.zoo.llm.build import toy_prompter_dir

    assert tree_files(cli_rebuilt / "toy-prompter") == tree_files(toy_prompter_dir())


@pytest.mark.parametrize(
    "kind, model_class",
    [("tiny-qwen3", "Qwen3ForCausalLM"), ("tiny-qwen3-moe", "Qwen3MoeForCausalLM")],
)
def test_transformers_loads_it_and_decodes_greedily(
    built: dict[str, Path], kind: str, model_class: str
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(built[kind])).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(built[kind]))
    config = model.config
    assert type(model).__name__ == model_class and config.architectures == [model_class]
    assert (config.hidden_size, config.head_dim, config.num_hidden_layers) == (
        64,
        32,
        2,
    )
    assert (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.max_position_embeddings,
    ) == (2, 1, 1024)
    assert (
        config.tie_word_embeddings
        and model.lm_head.weight is model.model.embed_tokens.weight
    )
    assert config.vocab_size == len(tokenizer)
    assert (
        config.eos_token_id
        == tokenizer.convert_tokens_to_ids("<|im_end|>")
        == model.generation_config.eos_token_id
    )
    assert config.pad_token_id == tokenizer.pad_token_id
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert (
        text == "<|im_start|>system\nbe "
        "brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    inputs = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    runs = [
        model.generate(
            **inputs,
            do_sample=False,
            max_new_tokens=8,
            pad_token_id=tokenizer.pad_token_id,
        )
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])  # greedy: the same tokens every time
    new = runs[0][0, inputs["input_ids"].shape[1] :]
    assert 1 <= len(new) <= 8 and int(new.max()) < config.vocab_size


def test_the_moe_model_routes_over_real_experts(built: dict[str, Path]) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    model = AutoModelForCausalLM.from_pretrained(str(built["tiny-qwen3-moe"])).eval()
    config = model.config
    assert (
        config.num_experts,
        config.num_experts_per_tok,
        config.moe_intermediate_size,
    ) == (4, 2, 32)
    assert config.mlp_only_layers == [] and config.norm_topk_prob
    for layer in model.model.layers:
        assert isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)
        assert tuple(layer.mlp.experts.gate_up_proj.shape) == (4, 2 * 32, 64)
    # The checkpoint stores each expert apart, as Qwen3-MoE checkpoints (and vLLM's
    # loader) have them.
    with safe_open(str(built["tiny-qwen3-moe"] / "model.safetensors"), "pt") as weights:
        keys = set(weights.keys())
    assert {
        f"model.layers.{i}.mlp.experts.{e}.{p}.weight"
        for i in range(2)
        for e in range(4)
        for p in ("gate_proj", "up_proj", "down_proj")
    } <= keys
    # The random router sends different tokens to different pairs of experts.
    with torch.no_grad():
        hidden = model.model.embed_tokens(torch.arange(200))
        _, _, chosen = model.model.layers[0].mlp.gate(hidden)
    assert len({tuple(sorted(row)) for row in chosen.tolist()}) >= 3


def test_every_prompt_word_is_one_token(built: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    from diffserve.zoo.llm.prompt_grammar import corpus

    tokenizer = AutoTokenizer.from_pretrained(str(built["tiny-qwen3"]))
    for word in corpus().split("\n")[0].split():
        if not word.startswith("0"):
            # after a space (inside a prompt), and first in a line (a short prompt right
            # after the template's "\n")
            assert (
                len(tokenizer(" " + word, add_special_tokens=False).input_ids) == 1
            ), word
            assert (
                len(tokenizer("\n" + word, add_special_tokens=False).input_ids) == 2
            ), word


def test_the_expansion_rule_writes_the_toy_grammars() -> None:
    from diffserve.zoo.toy_motion import grammar as motion
    from diffserve.zoo.toy_shapes import grammar as shapes

    assert expand("red circle") == "a red circle on a blue background"
    assert (
        expand("square moving left") == "a red square moving left on a blue background"
    )
    assert expand("red circle on green") == "a red circle on a green background"
    assert expand("circle on red") == "a white circle on a red background"
    assert all(
        colour != background for colour, background in DEFAULT_BACKGROUND.items()
    )
    for scene in [*shapes.all_scenes(), *motion.all_scenes()]:
        # A full grammar prompt is its own expansion.
        assert expand(scene.prompt) == scene.prompt
    for short in short_prompts():
        full, asked = expand(short), parse_short(short)
        if asked.direction is None:
            scene = shapes.parse_prompt(full)
            assert scene in shapes.all_scenes()
        else:
            scene = motion.parse_prompt(full)
            assert (
                scene.still in shapes.all_scenes()
                and scene.direction == asked.direction
            )
        assert scene.shape == asked.shape
        assert asked.colour in (None, scene.colour) and asked.background in (
            None,
            scene.background,
        )
    for bad in (
        "red circle on red",
        "circle moving",
        "circle on a blue",
        "Red circle",
        "red  circle",
        "a dog",
        "",
    ):
        with pytest.raises(ValueError):
            expand(bad)


def test_held_out_prompts_ask_for_what_training_never_showed() -> None:
    from diffserve.zoo.llm.prompt_grammar import HELD_OUT_MOTIONS, HELD_OUT_OBJECTS

    train, held = training_pairs(), held_out_pairs()
    assert len(train) + len(held) == len(short_prompts()) and not {
        s for s, _ in train
    } & {s for s, _ in held}
    seen = {tuple(full.split()[1:3]) for _, full in train}
    moves = {
        (full.split()[2], full.split()[4])
        for _, full in train
        if full.split()[3] == "moving"
    }
    assert not seen & set(HELD_OUT_OBJECTS) and not moves & set(HELD_OUT_MOTIONS)
    assert held_out_pairs(50) == held_out_pairs(50) and set(held_out_pairs(50)) <= set(
        held
    )


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for a tiny model's many small ops: on cores that other test
    processes keep busy, two threads waiting on each other made greedy decoding 10x
    slower (measured: 400 prompts 2-5 s against 0.2-0.6 s)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.numerics
def test_the_shipped_toy_prompter_expands_held_out_prompts(one_thread: None) -> None:
    from diffserve.zoo.llm.build import toy_prompter_dir
    from diffserve.zoo.llm.decode import greedy_expand, load_llm
    from diffserve.zoo.llm.train import PrompterTrainConfig

    shipped = toy_prompter_dir()
    assert sum(p.stat().st_size for p in shipped.iterdir()) < 1 << 20
    marker = json.loads((shipped / "diffserve_model.json").read_text(encoding="utf-8"))
    assert (marker["kind"], marker["random_weights"], marker["system_prompt"]) == (
        "toy-prompter",
        False,
        SYSTEM_PROMPT,
    )
    log = json.loads((shipped / "training.json").read_text(encoding="utf-8"))
    assert log["held_out_exact_match"] == 1.0 and log["held_out_pairs"] == len(
        held_out_pairs()
    )
    # Make-model toy-prompter --train retrains it.
    assert log["config"] == asdict(PrompterTrainConfig())
    model, tokenizer = load_llm(shipped)
    pairs = held_out_pairs()  # all 1602: ~1 s on one thread
    replies = greedy_expand(model, tokenizer, [short for short, _ in pairs])
    assert [
        (short, reply)
        for (short, want), reply in zip(pairs, replies, strict=True)
        if reply != want
    ] == []


def test_training_runs_end_to_end_on_a_tiny_budget(
    tmp_path: Path, one_thread: None
) -> None:
    """The trainer's every stage on 3 steps (the shipped run took 800): a model
    transformers loads, its log."""
    from transformers import AutoModelForCausalLM

    from diffserve.zoo.llm.train import PrompterTrainConfig, train_toy_prompter

    out = train_toy_prompter(
        tmp_path / "p", PrompterTrainConfig(max_steps=3, eval_every=3, threads=1)
    )
    assert set(tree_files(out)) == FILES | {"training.json"}
    log = json.loads((out / "training.json").read_text(encoding="utf-8"))
    assert (
        log["steps"] == 3
        and len(log["curve"]) == 1
        and 0.0 <= log["held_out_exact_match"] < 1.0
    )
    assert (
        json.loads((out / "diffserve_model.json").read_text(encoding="utf-8"))[
            "random_weights"
        ]
        is False
    )
    AutoModelForCausalLM.from_pretrained(str(out))


def test_make_model_refuses_what_a_language_model_cannot_take(tmp_path: Path) -> None:
    from diffserve.errors import ConfigError
    from diffserve.zoo.llm.specs import LLM_SPECS, TOY_PROMPTER_SPEC
    from diffserve.zoo.make_model import LLM_KINDS, TRAINED_LLM_KINDS
    from diffserve.zoo.make_model import make as run

    assert (
        tuple(LLM_SPECS) == LLM_KINDS and (TOY_PROMPTER_SPEC.name,) == TRAINED_LLM_KINDS
    )
    args = {
        "seed": None,
        "guidance_embeds": False,
        "base": None,
        "rank": 4,
        "train": False,
        "threads": 2,
        "force": False,
    }
    with pytest.raises(ConfigError, match="built, not trained"):
        run(
            Namespace(
                **{**args, "kind": "tiny-qwen3", "dir": tmp_path / "m", "train": True}
            )
        )
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "model_index.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds no config.json"):
        run(
            Namespace(
                **{
                    **args,
                    "kind": "tiny-qwen3-moe",
                    "dir": tmp_path / "other",
                    "force": True,
                }
            )
        )
    assert list((tmp_path / "other").iterdir()) == [
        tmp_path / "other" / "model_index.json"
    ]


def test_the_modules_import_cheaply() -> None:
    code = (
        "import sys, diffserve.zoo.llm.build, diffserve.zoo.llm.decode, "
        "diffserve.zoo.llm.train;"
        "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
