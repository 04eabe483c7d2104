"""Train the toy prompter on CPU: a tiny Qwen3 causal LM that expands short prompts into
the toy grammars.

Each example is the chat template's rendering of the system prompt and a short prompt
(``decode.chat_prompt``), then the target ``expand(short)`` and ``<|im_end|>``; the loss
is the next-token cross-entropy on the target's tokens only. Float32 AdamW on shuffled
batches from one seeded generator, so a run on the same machine and thread count repeats
itself (other thread counts or CPUs round differently: an equally good model, not the
same bytes).

Training stops once every held-out target token (teacher-forced) beats the runner-up by
``min_margin`` logits, or after ``max_steps``. A positive margin everywhere is exactly
greedy decoding reproducing every held-out expansion; the margin on top is headroom for
another runtime's float rounding (vLLM's kernels). The final check then decodes every
held-out prompt with transformers' ``generate`` and writes the figures to
``training.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from diffserve.logging import get_logger
from diffserve.zoo.components import MARKER_FILE, write_json
from diffserve.zoo.llm.build import (
    BUILDER_VERSION,
    LLM_MARKER,
    new_llm,
    save_llm,
    write_tokenizer,
)
from diffserve.zoo.llm.decode import chat_prompt, greedy_expand
from diffserve.zoo.llm.prompt_grammar import (
    SYSTEM_PROMPT,
    held_out_pairs,
    training_pairs,
)
from diffserve.zoo.llm.specs import END_OF_TURN, TOY_PROMPTER_SPEC
from diffserve.zoo.publish import build_into

__all__ = [
    "PrompterTrainConfig",
    "cpu_name",
    "encode_pairs",
    "target_margins",
    "train_toy_prompter",
]

logger = get_logger(__name__)

# the label of a token the loss skips (the prompt, the padding): torch's cross-entropy
# default
IGNORE = -100


@dataclass(frozen=True)
class PrompterTrainConfig:
    """The training budget; the defaults made the shipped weights."""

    seed: int = 0
    max_steps: int = 6000
    batch: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 100  # linear learning-rate warmup, then constant
    eval_every: int = 100
    # logits by which each held-out target token must beat the runner-up to stop early
    min_margin: float = 5.0
    threads: int = 2


def train_toy_prompter(
    out_dir: Path | str,
    config: PrompterTrainConfig = PrompterTrainConfig(),
    *,
    force: bool = False,
) -> Path:
    """Train the toy prompter and write it (causal-LM layout, safetensors,
    ``training.json``) to ``out_dir``."""
    target = Path(out_dir).expanduser().absolute()
    logger.info(
        "training %s (seed %d) into %s", TOY_PROMPTER_SPEC.name, config.seed, target
    )
    return build_into(
        target,
        lambda staging: _train_into(staging, config),
        force=force,
        marker=LLM_MARKER,
    )


def _train_into(out: Path, config: PrompterTrainConfig) -> None:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        started = time.perf_counter()
        tokenizer = write_tokenizer(out)
        model = new_llm(TOY_PROMPTER_SPEC, tokenizer, config.seed)
        train, held_out = training_pairs(), held_out_pairs()
        train_ids, train_labels = encode_pairs(tokenizer, train)
        held_ids, held_labels = encode_pairs(tokenizer, held_out)
        log = _fit(model, config, (train_ids, train_labels), (held_ids, held_labels))
        seconds = time.perf_counter() - started
        model.eval()
        shorts = [short for short, _ in held_out]
        replies = greedy_expand(model, tokenizer, shorts)
        exact = sum(
            reply == want for reply, (_, want) in zip(replies, held_out, strict=True)
        ) / len(held_out)
        if exact < 1.0:
            logger.warning(
                "%s: greedy decoding expands %.1f%% of the held-out "
                "prompts right after %d steps",
                TOY_PROMPTER_SPEC.name,
                100 * exact,
                log["steps"],
            )
        save_llm(model, out)
    finally:
        torch.set_num_threads(threads)
    summary = {
        "config": asdict(config),
        "steps": log["steps"],
        "seconds": round(seconds, 1),
        "final_loss": log["final_loss"],
        "training_pairs": len(train),
        "held_out_pairs": len(held_out),
        "held_out_exact_match": exact,
        "held_out_min_margin": log["min_margin"],
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "curve": log["curve"],
    }
    (out / "training.json").write_text(
        json.dumps(summary, indent=1) + "\n", encoding="utf-8"
    )
    write_json(
        out / MARKER_FILE,
        {
            "builder_version": BUILDER_VERSION,
            "kind": TOY_PROMPTER_SPEC.name,
            "description": TOY_PROMPTER_SPEC.description,
            "seed": config.seed,
            "random_weights": False,
            "system_prompt": SYSTEM_PROMPT,
        },
    )


def encode_pairs(tokenizer: Any, pairs: list[tuple[str, str]]) -> tuple[Any, Any]:
    """(input ids, labels) [N, L], right-padded: each row the chat prompt then the
    target and ``<|im_end|>``; labels are the input ids on the target's tokens and
    IGNORE elsewhere."""
    import torch

    rows = []
    for short, full in pairs:
        prompt = tokenizer(
            chat_prompt(tokenizer, short), add_special_tokens=False
        ).input_ids
        reply = tokenizer(full + END_OF_TURN, add_special_tokens=False).input_ids
        rows.append((prompt, reply))
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (prompt, reply) in enumerate(rows):
        ids[i, : len(prompt) + len(reply)] = torch.tensor(prompt + reply)
        labels[i, len(prompt) : len(prompt) + len(reply)] = torch.tensor(reply)
    return ids, labels


def target_margins(model: Any, ids: Any, labels: Any, *, batch_size: int = 256) -> Any:
    """[N] the smallest margin, over each row's target tokens, of the target's logit
    over the best other one (teacher-forced): positive everywhere exactly when greedy
    decoding reproduces the row's target."""
    import torch

    out = []
    with torch.no_grad():
        for start in range(0, len(ids), batch_size):
            x, y = ids[start : start + batch_size], labels[start : start + batch_size]
            logits = model(input_ids=x, attention_mask=x != _pad_of(model)).logits[
                :, :-1
            ]
            y = y[:, 1:]
            known = y != IGNORE
            safe = y.clamp(min=0)
            right = logits.gather(-1, safe[..., None])[..., 0]
            others = logits.scatter(-1, safe[..., None], float("-inf")).amax(-1)
            margin = torch.where(
                known, right - others, torch.full_like(right, float("inf"))
            )
            out.append(margin.amin(-1))
    return torch.cat(out)


def _pad_of(model: Any) -> int:
    return int(model.config.pad_token_id)


def _fit(
    model: Any,
    config: PrompterTrainConfig,
    train: tuple[Any, Any],
    held: tuple[Any, Any],
) -> dict[str, Any]:
    """Train until every held-out margin reaches ``config.min_margin`` or for
    ``config.max_steps``."""
    import torch

    ids, labels = train
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / config.warmup)
    )
    order = torch.randperm(len(ids), generator=generator)
    cursor = 0
    losses: list[float] = []
    curve: list[dict[str, float]] = []
    min_margin = float("-inf")
    step = 0
    while step < config.max_steps:
        # A new epoch: a fresh shuffle from the same generator.
        if cursor + config.batch > len(order):
            order, cursor = torch.randperm(len(ids), generator=generator), 0
        rows = order[cursor : cursor + config.batch]
        cursor += config.batch
        x, y = _trimmed(ids[rows], labels[rows], _pad_of(model))
        model.train()
        loss = model(input_ids=x, attention_mask=x != _pad_of(model), labels=y).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        step += 1
        losses.append(loss.item())
        if step % config.eval_every == 0 or step == config.max_steps:
            model.eval()
            margins = target_margins(model, *held)
            min_margin = margins.min().item()
            recent = sum(losses[-config.eval_every :]) / len(
                losses[-config.eval_every :]
            )
            exact = (margins > 0).float().mean().item()
            curve.append(
                {
                    "step": step,
                    "loss": round(recent, 5),
                    "held_out_exact_match": round(exact, 4),
                    "held_out_min_margin": round(min_margin, 3),
                }
            )
            logger.info(
                "step %d: loss %.4f, held-out exact %.1f%%, min margin %.2f",
                step,
                recent,
                100 * exact,
                min_margin,
            )
            if min_margin >= config.min_margin:
                break
    tail = losses[-config.eval_every :]
    return {
        "steps": step,
        "final_loss": round(sum(tail) / len(tail), 5),
        "min_margin": round(min_margin, 3),
        "curve": curve,
    }


def _trimmed(ids: Any, labels: Any, pad: int) -> tuple[Any, Any]:
    """A batch without the columns that are padding in every row."""
    used = (ids != pad).any(0).nonzero().max().item() + 1
    return ids[:, :used], labels[:, :used]


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string
    elsewhere)."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
