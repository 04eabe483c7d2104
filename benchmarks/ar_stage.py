"""(r) The AR stage: an LLM on vLLM in front of the diffusion stages (``stages:`` entry
``kind: ar``).

Three measurements in one run, all with the trained toy prompter
(``diffserve.zoo.llm.build.toy_prompter_dir``: a tiny Qwen3 that expands "red circle"
into "a red circle on a blue background"), float32, eager, greedy:

1. vLLM against transformers on the same weights and the same inputs: diffserve's
   ``VllmEngine`` (vLLM's own
   ``LLMEngine`` on the uni executor, driven step by step on this thread, as the AR
   stage drives it) against ``AutoModelForCausalLM.generate(do_sample=False)``
   (left-padded batch, like ``zoo/llm/decode.py``), both fed the chat template over the
   system prompt and the short prompt (``ar/chat.py``). One prompt alone, then a batch;
   time to first token (per request, from the call's start to the end of the step that
   drew its first token: vLLM's ``step`` returning, transformers' streamer receiving
   it), total time, output tokens (EOS included) per second, and how many greedy texts
   the two agree on (reported, not asserted).
2. The end-to-end cost of a rewrite in front of toy-shapes: one ``Engine`` with the AR
   stage; each held-out short
   prompt once rewritten (the default) and once with ``rewrite_prompt=False`` and the
   full prompt the rewrite should give (``prompt_grammar.expand``: the diffusion stages'
   work is the same), interleaved. The AR stage's share is the request's
   ``timings["ar_stage_0"]``.
3. Start-up: ``import vllm``, a uni (in-process) engine's first start, the Engine's
   start with the AR stage, and
   (full mode) an mp engine's start (engine core and worker in processes of their own)
   with its first request.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, spread, to_array
from benchmarks.section import Section
from benchmarks.settings import SEED, Case, Settings

DTYPE = "float32"
# zoo/llm/decode.py's MAX_NEW_TOKENS: the longest expansion is 10 tokens with its EOS
MAX_TOKENS = 16
MAX_MODEL_LEN = 128
KV_CACHE_BYTES = 32 << 20
# The model's size and its default steps (guidance 0)
E2E_CASE = Case("toy-shapes", 64, 8)
PAIRS_SEED = 41


@dataclass
class Drawn:
    """One call's texts (whitespace-normalized), output tokens, and each request's time
    to first token."""

    texts: list[str]
    tokens: int
    first_token_s: list[float] = field(default_factory=list)


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    started = time.perf_counter()
    fresh = "vllm" not in sys.modules
    import vllm  # noqa: F401 - ImportError: the section is "not available"

    import_s = time.perf_counter() - started
    llm, llm_note = _prompter(models)
    shorts = short_prompts(max(settings.ar_batch, settings.ar_requests))
    section.columns = [
        "measurement",
        "contender",
        "prompts",
        "median ms",
        "spread ±",
        "runs",
        "TTFT ms",
        "output tokens",
        "tokens/s",
        "ratio",
        "check",
    ]
    section.notes.append(
        f"{llm_note}, {DTYPE}, eager, greedy (temperature 0), "
        f"at most {MAX_TOKENS} new tokens, vLLM {vllm.__version__} "
        f"(max_num_seqs {settings.ar_batch}, max_model_len {MAX_MODEL_LEN}, "
        f"KV cache {KV_CACHE_BYTES >> 20} MiB); "
        "held-out short prompts of the toy grammar (never in "
        f"training), e.g. {shorts[0]!r}."
    )
    section.notes.append(
        "TTFT: per request, from the call's start to the end "
        "of the step that drew its first token (median over "
        "the batch, then over runs); tokens/s: output tokens "
        "(EOS included) / median total; ratio: vLLM / "
        "transformers total time (rewrite / no rewrite end to end); median of "
        f"{settings.ar_iters} interleaved runs after {settings.warmup} warm-up."
    )
    label = (
        "import vllm (torch already loaded)"
        if fresh
        else "import vllm (already imported)"
    )
    section.add("start", label, "", _ms(import_s), "", 1, "", "", "", "", "")
    section.metrics["ar.start.import_s"] = import_s
    config = _deploy(llm, settings.ar_batch, "uni")
    _vllm_vs_transformers(section, settings, llm, config, shorts)
    _end_to_end(section, settings, config, shorts[: settings.ar_requests])
    if settings.ar_mp:
        _mp_start(section, _deploy(llm, settings.ar_batch, "mp"), shorts[0])


def short_prompts(n: int) -> list[str]:
    """``n`` held-out short prompts that toy-shapes can draw (no motion), the same on
    every run."""
    from diffserve.zoo.llm.prompt_grammar import held_out_pairs

    still = [short for short, full in held_out_pairs() if " moving " not in f" {full} "]
    return [
        still[i]
        for i in sorted(
            random.Random(PAIRS_SEED).sample(range(len(still)), min(n, len(still)))
        )
    ]


def _prompter(models: dict[str, Path]) -> tuple[Path, str]:
    """The trained toy prompter; if its asset is missing, the random-weight tiny-qwen3
    (built in the cache)."""
    from diffserve.errors import ConfigError
    from diffserve.zoo.llm.build import build_tiny_llm, toy_prompter_dir

    try:
        return (
            toy_prompter_dir(),
            "toy-prompter (trained, diffserve/assets/toy-prompter)",
        )
    except ConfigError as exc:
        cache = (
            next(iter(models.values())).parent
            if models
            else Path(__file__).resolve().parent / ".cache"
        )
        out = cache / "tiny-qwen3"
        path = (
            out
            if (out / "config.json").is_file()
            else build_tiny_llm("tiny-qwen3", out, force=True)
        )
        return Path(
            path
        ), f"tiny-qwen3 (random weights: the toy prompter is missing: {exc})"


def _deploy(llm: Path, max_num_seqs: int, executor: str) -> dict[str, Any]:
    """The deploy config: the AR stage (the prompter), then toy-shapes."""
    from diffserve.zoo.demo import toy_model_dir
    from diffserve.zoo.llm.prompt_grammar import SYSTEM_PROMPT

    ar = {
        "stage_id": 0,
        "kind": "ar",
        "role": "prompt_rewrite",
        "model": str(llm),
        "dtype": DTYPE,
        "enforce_eager": True,
        "max_num_seqs": max_num_seqs,
        "max_model_len": MAX_MODEL_LEN,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "distributed_executor_backend": executor,
        "system_prompt": SYSTEM_PROMPT,
        "default_sampling_params": {"temperature": 0, "max_tokens": MAX_TOKENS},
    }
    return {
        "model": str(toy_model_dir()),
        "dtype": DTYPE,
        "enforce_eager": True,
        "stages": [ar, {"stage_id": 1}],
    }


def _stage(config: dict[str, Any]) -> Any:
    from diffserve.config import resolve

    return resolve(deploy_config=config).ar_stages[0]


# -- 1. vLLM against transformers generate
# ----------------------------------------------------------------------


def _vllm_vs_transformers(
    section: Section,
    settings: Settings,
    llm: Path,
    config: dict[str, Any],
    shorts: Sequence[str],
) -> None:
    from diffserve.ar.vllm_engine import VllmEngine

    engine = VllmEngine(_stage(config))
    t0 = time.perf_counter()
    try:
        engine.start()
        start_s = time.perf_counter() - t0
        section.add(
            "start",
            "vLLM engine, uni (in-process), first start",
            "",
            _ms(start_s),
            "",
            1,
            "",
            "",
            "",
            "",
            "",
        )
        section.metrics["ar.start.uni_s"] = start_s
        model, tokenizer = _load_transformers(llm)
        for label, prompts in (
            ("one prompt", list(shorts[:1])),
            (f"batch of {settings.ar_batch}", list(shorts[: settings.ar_batch])),
        ):
            key = "single" if len(prompts) == 1 else "batch"
            draws: dict[str, list[Drawn]] = {"vLLM": [], "transformers": []}
            calls = {
                "vLLM": _kept(partial(_vllm_draw, engine, prompts), draws["vLLM"]),
                "transformers": _kept(
                    partial(
                        _transformers_draw,
                        model,
                        tokenizer,
                        engine.stage.system_prompt,
                        prompts,
                    ),
                    draws["transformers"],
                ),
            }
            samples, _ = interleaved(
                calls, warmup=settings.warmup, iters=settings.ar_iters
            )
            vllm_texts, hf_texts = (
                draws["vLLM"][-1].texts,
                draws["transformers"][-1].texts,
            )
            agree = sum(a == b for a, b in zip(vllm_texts, hf_texts, strict=True))
            expected = _expansions(prompts)
            base = median(samples["transformers"])
            for name, times in samples.items():
                last = draws[name][-1]
                ttft = median(
                    [median(d.first_token_s) for d in draws[name][settings.warmup :]]
                )
                right = sum(t == e for t, e in zip(last.texts, expected, strict=True))
                check = (
                    f"greedy texts equal: {agree}/{len(prompts)}; = expand(): "
                    f"{right}/{len(prompts)}"
                )
                section.add(
                    label,
                    f"{name} ({'VllmEngine, uni' if name == 'vLLM' else 'generate'})",
                    len(prompts),
                    _ms(median(times)),
                    f"{spread(times):.0%}",
                    len(times),
                    _ms(ttft),
                    last.tokens,
                    round(last.tokens / median(times), 1),
                    round(median(times) / base, 3),
                    check,
                )
                short = "vllm" if name == "vLLM" else "transformers"
                section.metrics[f"ar.{short}.{key}.total_ms"] = median(times) * 1000
                section.metrics[f"ar.{short}.{key}.ttft_ms"] = ttft * 1000
                section.metrics[f"ar.{short}.{key}.tokens_per_s"] = (
                    last.tokens / median(times)
                )
            section.metrics[f"ar.{key}.greedy_equal"] = f"{agree}/{len(prompts)}"
            section.metrics[f"ar.{key}.vllm_vs_transformers"] = (
                median(samples["vLLM"]) / base
            )
    finally:
        engine.shutdown()


def _kept(draw: Callable[[], Drawn], into: list[Drawn]) -> Callable[[], None]:
    """``draw`` as a contender that keeps every call's result (warm-up calls first)."""
    return lambda: into.append(draw())


def _load_transformers(llm: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(llm), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(llm))
    tokenizer.padding_side = "left"  # a batch's replies all start at its last column
    return model, tokenizer


_ids = iter(range(1 << 62))


def _vllm_draw(engine: Any, prompts: list[str]) -> Drawn:
    """Every prompt added at once (one batch, continuous batching), stepped until all
    finished."""
    start = time.perf_counter()
    ids = [f"bench-ar-{next(_ids)}" for _ in prompts]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add(request_id, prompt)
    first: dict[str, float] = {}
    done: dict[str, Any] = {}
    while engine.busy:
        finished = engine.step()
        now = time.perf_counter() - start
        for request_id in ids:
            run = engine.running.get(request_id)
            if (
                request_id not in first
                and run is not None
                and run.first_token is not None
            ):
                first[request_id] = now
        for output in finished:
            first.setdefault(output.request_id, now)
            done[output.request_id] = output
    return Drawn(
        [_normal(done[r].text) for r in ids],
        sum(done[r].output_tokens for r in ids),
        [first[r] for r in ids],
    )


def _transformers_draw(
    model: Any, tokenizer: Any, system_prompt: str, prompts: list[str]
) -> Drawn:
    """One ``generate`` over the left-padded batch, greedy; a streamer stamps the first
    drawn token."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    from diffserve.ar.chat import chat_messages

    start = time.perf_counter()

    class FirstToken(BaseStreamer):
        """``put`` gets the prompt first, then each step's tokens."""

        def __init__(self) -> None:
            self.calls, self.at = 0, 0.0

        def put(self, value: Any) -> None:
            self.calls += 1
            if self.calls == 2:
                self.at = time.perf_counter() - start

        def end(self) -> None:
            pass

    streamer = FirstToken()
    texts = [
        tokenizer.apply_chat_template(
            chat_messages(system_prompt, p), tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]
    batch = tokenizer(
        texts, return_tensors="pt", padding=True, add_special_tokens=False
    )
    with torch.inference_mode():
        out = model.generate(
            **batch,
            do_sample=False,
            max_new_tokens=MAX_TOKENS,
            pad_token_id=tokenizer.pad_token_id,
            streamer=streamer,
        )
    new = out[:, batch["input_ids"].shape[1] :]
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    tokens = 0
    for row in new.tolist():
        stop = next((i for i, t in enumerate(row) if t in eos_ids), None)
        tokens += len(row) if stop is None else stop + 1
    return Drawn(
        [_normal(t) for t in tokenizer.batch_decode(new, skip_special_tokens=True)],
        tokens,
        [streamer.at] * len(prompts),
    )


def _ms(seconds: float) -> float | int:
    """Milliseconds for the table: whole ones from a second up (the report prints 4
    significant digits)."""
    ms = seconds * 1000
    return round(ms) if ms >= 1000 else round(ms, 2)


def _normal(text: str) -> str:
    return " ".join(text.split())


def _expansions(shorts: Sequence[str]) -> list[str]:
    from diffserve.zoo.llm.prompt_grammar import expand

    return [expand(s) for s in shorts]


# -- 2. end to end in front of toy-shapes
# ----------------------------------------------------------------------


def _end_to_end(
    section: Section, settings: Settings, config: dict[str, Any], shorts: Sequence[str]
) -> None:
    from diffserve import Engine

    t0 = time.perf_counter()
    engine = Engine(deploy_config=config)
    start_s = time.perf_counter() - t0
    section.add(
        "start",
        "Engine with the AR stage (toy-shapes + vLLM uni)",
        "",
        _ms(start_s),
        "",
        1,
        "",
        "",
        "",
        "",
        "",
    )
    section.metrics["ar.start.engine_s"] = start_s
    executor = str(engine.executor_name)
    try:
        full = _expansions(shorts)
        outputs: dict[str, list[Any]] = {"rewrite": [], "no rewrite": []}

        def call(name: str) -> Callable[[], None]:
            def run() -> None:
                i = len(outputs[name]) % len(shorts)
                rewrite = name == "rewrite"
                outputs[name].append(
                    engine.generate(
                        _request(shorts[i] if rewrite else full[i], SEED + i, rewrite)
                    )
                )

            return run

        rounds = settings.warmup * len(shorts)
        for _ in range(rounds):  # warm-up: every prompt once per contender
            call("rewrite")()
            call("no rewrite")()
        samples, _ = interleaved(
            {"rewrite": call("rewrite"), "no rewrite": call("no rewrite")},
            warmup=0,
            iters=settings.ar_passes * len(shorts),
        )
    finally:
        C.shutdown(engine)
    timed = {name: outs[rounds:] for name, outs in outputs.items()}
    stage_ms = [o.timings.get("ar_stage_0", float("nan")) for o in timed["rewrite"]]
    tokens = [o.attestation["ar"][0]["output_tokens"] for o in timed["rewrite"]]
    n = len(timed["rewrite"])
    revised = sum(
        o.revised_prompt == full[i % len(full)] for i, o in enumerate(timed["rewrite"])
    )
    same = sum(
        np.array_equal(to_array(a.images[0]), to_array(b.images[0]))
        for a, b in zip(timed["rewrite"], timed["no rewrite"], strict=True)
    )
    base = median(samples["no rewrite"])
    extra = median(samples["rewrite"]) - base
    for name, times in samples.items():
        rewrite = name == "rewrite"
        check = (
            f"AR stage {median(stage_ms):.1f} "
            f"ms ({median(stage_ms) / 1000 / median(times):.0%} "
            "of the request); "
            f"revised = expand(): {revised}/{n}; same image as no rewrite: {same}/{n}"
            if rewrite
            else "full prompt sent, rewrite_prompt=False"
        )
        section.add(
            f"end to end, {E2E_CASE.label}",
            name,
            1,
            _ms(median(times)),
            f"{spread(times):.0%}",
            len(times),
            "",
            median(tokens) if rewrite else "",
            round(median(tokens) / (median(stage_ms) / 1000), 1) if rewrite else "",
            round(median(times) / base, 3),
            check,
        )
        section.metrics[f"ar.e2e.{name.replace(' ', '_')}.ms"] = median(times) * 1000
    section.metrics["ar.e2e.stage_ms"] = median(stage_ms)
    section.metrics["ar.e2e.extra_ms"] = extra * 1000
    section.metrics["ar.e2e.ratio"] = median(samples["rewrite"]) / base
    section.notes.append(
        "End to end: one Engine "
        f"(toy-shapes {E2E_CASE.size}x{E2E_CASE.size}/{E2E_CASE.steps} "
        "steps, guidance 0, "
        f"{DTYPE}, eager, executor {executor}; the AR stage "
        f"on vLLM uni in this process), {len(shorts)} short "
        "prompts one "
        f"request at a time, {settings.ar_passes} timed pass(es) "
        "with each prompt once per contender, interleaved, "
        f"after {settings.warmup} warm-up pass(es); the rewrite "
        f"adds {extra * 1000:.1f} ms per image (median with "
        "- "
        "median without). tokens/s of the rewrite row: output "
        "tokens / the AR stage's time (timings['ar_stage_0'], "
        "queueing and tokenization included)."
    )


def _request(prompt: str, seed: int, rewrite: bool) -> Any:
    from diffserve import GenerationRequest

    return GenerationRequest(
        prompt=prompt,
        height=E2E_CASE.size,
        width=E2E_CASE.size,
        num_inference_steps=E2E_CASE.steps,
        guidance_scale=0.0,
        seed=seed,
        rewrite_prompt=None if rewrite else False,
    )


# -- 3. the mp executor's start
# ----------------------------------------------------------------------------------


def _mp_start(section: Section, config: dict[str, Any], prompt: str) -> None:
    """vLLM's engine core and worker in processes of their own: the start, then one
    request (a failure is a row)."""
    from diffserve.ar.vllm_engine import VllmEngine

    engine = VllmEngine(_stage(config))
    try:
        t0 = time.perf_counter()
        engine.start()
        start_s = time.perf_counter() - t0
        section.add(
            "start",
            "vLLM engine, mp (own processes)",
            "",
            _ms(start_s),
            "",
            1,
            "",
            "",
            "",
            "",
            f"worker pids {[a['worker_pid'] for a in engine.attestation]}",
        )
        section.metrics["ar.start.mp_s"] = start_s
        t0 = time.perf_counter()
        drawn = _vllm_draw(engine, [prompt])
        seconds = time.perf_counter() - t0
        section.add(
            "one prompt, first request",
            "vLLM (VllmEngine, mp)",
            1,
            _ms(seconds),
            "",
            1,
            _ms(drawn.first_token_s[0]),
            drawn.tokens,
            round(drawn.tokens / seconds, 1),
            "",
            f"= expand(): {drawn.texts == _expansions([prompt])}",
        )
    except Exception as exc:  # noqa: BLE001 - the optional mp start must not lose the section's other rows
        section.add(
            "start",
            "vLLM engine, mp (own processes)",
            "",
            "failed",
            "",
            0,
            "",
            "",
            "",
            "",
            f"{type(exc).__name__}: {exc}"[:300],
        )
    finally:
        engine.shutdown()
