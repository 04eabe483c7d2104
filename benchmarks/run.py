"""Entry point: ``python -m benchmarks.run [--smoke] [--out PATH] [--only a,b]``.

Builds the models it needs with the project's builder (cached in benchmarks/.cache),
runs every measurement (each one degrades to "not available"/"failed" instead of
stopping the run), then writes the report and a JSON file beside it (results.json beside
RESULTS.md, <out stem>.json for another name). Each CPU kind has its own report
(``default_report``): RESULTS.md for AVX2, RESULTS-<KIND>.md for the others (AMX,
AVX512_BF16, AVX512); a run never writes over a report measured on another kind.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# Before torch/transformers/diffusers are imported anywhere: nothing may come from a
# hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks import (  # noqa: E402
    ar_stage,
    arrivals,
    cold_start,
    e2e_latency,
    generic,
    lora,
    mixed_traffic,
    overhead,
    parallel,
    quantization,
    qwen_image21_native,
    replicas,
    stages,
    step_cache,
    step_cache_trained,
    step_cache_video,
    throughput,
    tracing,
    transformer_step,
    video,
)
from benchmarks.common import machine, pin_threads  # noqa: E402
from benchmarks.models import DEFAULT_CACHE, ensure_model, model_facts  # noqa: E402
from benchmarks.report import json_path, write_json, write_markdown  # noqa: E402
from benchmarks.section import Section, guarded  # noqa: E402
from benchmarks.settings import FULL, SMOKE, Settings  # noqa: E402
from benchmarks.targets import evaluate  # noqa: E402

HERE = Path(__file__).resolve().parent


def default_report(kind: str) -> Path:
    """This CPU kind's report: RESULTS.md (the first, AVX2 machine's), else
    RESULTS-<KIND>.md."""
    return HERE / ("RESULTS.md" if kind == "AVX2" else f"RESULTS-{kind}.md")


# key, title, measure(section, settings, models)
MEASUREMENTS = (
    (
        "e2e",
        "a. End-to-end latency per image: diffserve vs diffusers",
        e2e_latency.measure,
    ),
    ("step", "b. Transformer step vs matmul peak", transformer_step.measure),
    ("overhead", "c. Executor and HTTP overhead per image", overhead.measure),
    ("throughput", "d. Throughput with concurrent clients", throughput.measure),
    ("cold", "e. Cold start and peak memory", cold_start.measure),
    ("replicas", "f. Replicas and the Ray executor", replicas.measure),
    ("parallel", "g. Parallel denoising (CFG and Ulysses)", parallel.measure),
    ("cache", "h. Step cache side by side with cache-dit", step_cache.measure),
    ("arrivals", "i. Step-level batching under Poisson arrivals", arrivals.measure),
    (
        "generic",
        "j. The generic path: SD3 through diffusers' pipeline on our kernels",
        generic.measure,
    ),
    (
        "lora",
        "k. Per-request LoRA: adapter overhead and mixed-adapter throughput",
        lora.measure,
    ),
    (
        "cache_trained",
        "l. Step cache on a trained model against a random one",
        step_cache_trained.measure,
    ),
    (
        "quant",
        "m. Quantized weights: int8 and float8 through torchao",
        quantization.measure,
    ),
    (
        "stages",
        "n. Stages at runtime: three stages pipelined, and the conditioning cache",
        stages.measure,
    ),
    (
        "video",
        "o. Video: native Wan vs diffusers' WanPipeline, step "
        "vs matmul peak, CFG-parallel",
        video.measure,
    ),
    (
        "tracing",
        "p. Tracing: HTTP latency with OpenTelemetry on vs off",
        tracing.measure,
    ),
    (
        "cache_video",
        "q. Step cache on the trained toy video model against a random one",
        step_cache_video.measure,
    ),
    (
        "ar_stage",
        "r. The AR stage: vLLM vs transformers generate, and "
        "a prompt rewrite in front of toy-shapes",
        ar_stage.measure,
    ),
    (
        "mixed",
        "s. Mixed traffic: step-level batching of mixed sizes, steps, cache "
        "thresholds and adapters",
        mixed_traffic.measure,
    ),
    (
        "qwen21",
        "t. Qwen-Image-2.1: the generic path, and would a native path pay?",
        qwen_image21_native.measure,
    ),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--smoke", action="store_true", help="tiny model, a couple of iterations (CI)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="markdown report path "
        "(default: this CPU kind's, "
        "benchmarks/RESULTS[-KIND].md)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_CACHE,
        help="where built models are kept",
    )
    p.add_argument(
        "--only",
        default="",
        help="comma-separated measurement "
        "keys: e2e,step,overhead,throughput,cold,replicas,parallel,cache,"
        "arrivals,generic,lora,cache_trained,quant,stages,video,tracing,cache_video,ar_stage,"
        "mixed",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the sections of the report at --out that this "
        "run does not measure (only when "
        "it was measured in the same mode on the same CPU capability)",
    )
    p.add_argument(
        "--render",
        type=Path,
        default=None,
        metavar="JSON",
        help="measure nothing: rebuild the report (targets and their "
        "notes) from a results JSON",
    )
    return p.parse_args(argv)


def render(source: Path, out: Path) -> int:
    """Re-evaluate the targets of a finished run (e.g. after editing targets.NOTES) and
    rewrite its report."""
    import json

    data = json.loads(source.read_text(encoding="utf-8"))
    settings = SMOKE if data["mode"] == "smoke" else FULL
    sections = [Section(**s) for s in data["sections"]]
    targets = evaluate(sections, settings, data["machine"].get("cpu_capability", ""))
    write_markdown(
        out,
        data["machine"],
        data["models"],
        settings,
        sections,
        targets,
        data["total_s"],
        generated=data.get("generated"),
    )
    write_json(
        json_path(out),
        data["machine"],
        data["models"],
        settings,
        sections,
        targets,
        data["total_s"],
        generated=data.get("generated"),
    )
    print(f"[bench] re-rendered {out} from {source}", flush=True)
    return 0


def refuse_other_kind(out: Path, info: dict) -> None:
    """A report keeps the figures of one CPU kind: never write over one measured on
    another."""
    import json

    path = json_path(out)
    if not path.exists():
        return
    theirs = (
        json.loads(path.read_text(encoding="utf-8"))
        .get("machine", {})
        .get("cpu_capability")
    )
    if theirs != info.get("cpu_capability"):
        raise SystemExit(
            f"{out} holds figures of a {theirs} machine and this "
            f"one is {info.get('cpu_capability')}; "
            f"write to {default_report(str(info.get('cpu_capability'))).name} "
            "(the default) or another --out"
        )


def kept_sections(out: Path, info: dict, settings: Settings) -> dict[str, Section]:
    """The sections of the report at ``out`` (``--merge``), refused when they were
    measured in another mode or on another CPU capability: figures of one machine kind
    never mix with another's."""
    import json

    path = json_path(out)
    if not path.exists():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    mode = "smoke" if settings.smoke else "full"
    theirs = (data.get("mode"), data.get("machine", {}).get("cpu_capability"))
    if theirs != (mode, info.get("cpu_capability")):
        raise SystemExit(
            f"--merge: {path} was measured as {theirs}, this run "
            f"is {(mode, info.get('cpu_capability'))}; "
            "write to another --out"
        )
    return {s["key"]: Section(**s) for s in data["sections"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        return render(
            args.render,
            args.out
            or args.render.with_name(
                "RESULTS.md"
                if args.render.name == "results.json"
                else f"{args.render.stem}.md"
            ),
        )
    settings: Settings = SMOKE if args.smoke else FULL
    only = {k.strip() for k in args.only.split(",") if k.strip()}
    started = time.perf_counter()
    threads = pin_threads()
    info = machine()
    print(
        f"[bench] {'smoke' if settings.smoke else 'full'} run "
        f"on {info['cpu']} ({threads} threads)",
        flush=True,
    )

    models: dict[str, Path] = {}
    facts: dict[str, dict[str, object]] = {}
    for kind in settings.models:
        path, seconds = ensure_model(kind, args.cache_dir)
        models[kind] = path
        facts[kind] = {**model_facts(path), "build_s": round(seconds, 1)}

    out = args.out or default_report(str(info["cpu_capability"]))
    refuse_other_kind(out, info)
    total = 0.0
    kept = kept_sections(out, info, settings) if args.merge else {}
    sections: list[Section] = []
    for key, title, fn in MEASUREMENTS:
        if only and key not in only:
            if key in kept:
                sections.append(kept[key])
            continue
        sections.append(guarded(key, title, lambda s, fn=fn: fn(s, settings, models)))
        # Written after every measurement, so a long run can be read (and survives)
        # part-way.
        total = time.perf_counter() - started
        targets = evaluate(sections, settings, info["cpu_capability"])
        write_markdown(out, info, facts, settings, sections, targets, total)
        write_json(json_path(out), info, facts, settings, sections, targets, total)
    # Once more with every section: kept ones after the last measured one were appended
    # since.
    total = time.perf_counter() - started
    targets = evaluate(sections, settings, info["cpu_capability"])
    write_markdown(out, info, facts, settings, sections, targets, total)
    write_json(json_path(out), info, facts, settings, sections, targets, total)
    print(f"[bench] wrote {out} and {json_path(out)} in {total:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
