"""One FLUX.1-dev double block and one single block on a GPU: ``python -m
benchmarks.gpu_blocks`` (``make gpu-check`` runs it first, ~2 minutes).

The real widths (hidden 3072, 24 heads x 128, MLP 12288) at 1024x1024 (4096 image + 512
text tokens), random bfloat16 weights, without building the 12B model. Each contender
(eager on each attention backend, the fused single block, inductor's
``max-autotune-no-cudagraphs``, fp8 and int8) is timed with CUDA events (median of the
timed calls after warm-up) and projected to an image: ``steps x (19 double + 38
single)``, the transformer's other layers being under 1% of its FLOPs. The fastest
contender's top kernels come from the profiler. Writes
``benchmarks/RESULTS-GPU-BLOCKS.md`` and its JSON twin.

``--smoke`` runs the same code at toy widths on the CPU (wall-clock timing, eager only)
and writes where ``--out`` says: the CPU test that keeps this script working.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DOUBLE_BLOCKS, SINGLE_BLOCKS = 19, 38


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    image_tokens: int
    text_tokens: int
    axes_dim: tuple[int, int, int]


FLUX_DEV_1024 = Shape(3072, 24, 4096, 512, (16, 56, 56))
SMOKE = Shape(128, 4, 64, 16, (8, 12, 12))


@dataclass(frozen=True)
class Contender:
    name: str
    attention: str
    fused: bool = False
    compiled: bool = False
    quantization: str = "none"


def contenders(smoke: bool) -> list[Contender]:
    if smoke:
        return [
            Contender("eager sdpa", "sdpa"),
            Contender("eager sdpa fused", "sdpa", fused=True),
            Contender("eager math fused", "math", fused=True),
        ]
    return [
        Contender("eager sdpa", "sdpa"),
        Contender("eager sdpa_cudnn", "sdpa_cudnn"),
        Contender("eager fa3", "fa3"),
        Contender("eager auto fused", "auto", fused=True),
        Contender("int8 eager", "auto", fused=True, quantization="int8"),
        # Each compiled contender autotunes its GEMMs (a minute or more): last
        Contender("compiled auto fused", "auto", fused=True, compiled=True),
        Contender("fp8 compiled", "auto", True, True, "fp8"),
    ]


def build_blocks(
    contender: Contender, shape: Shape, device: Any, dtype: Any
) -> tuple[Any, Any, Any]:
    """(double block, single block, kernel set) as a FLUX stage builds them."""
    import torch

    from diffserve.config.stage_sections import AttentionBackendConfig
    from diffserve.layers.kernels import build_kernel_set
    from diffserve.layers.linear.quantized import quantize_linears
    from diffserve.layers.traced_tally import compile_counted
    from diffserve.models.compile_options import compile_options
    from diffserve.models.flux.blocks import DoubleStreamBlock, SingleStreamBlock
    from diffserve.registry.models import FLUX_FEATURES, FLUX_ROLES

    kernels = build_kernel_set(
        "torch",
        AttentionBackendConfig(contender.attention),
        roles=FLUX_ROLES,
        device=device,
        dtype=dtype,
        batch_invariant=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        double = DoubleStreamBlock(shape.hidden, shape.heads, 4.0, True, kernels)
        single = SingleStreamBlock(shape.hidden, shape.heads, 4.0, kernels)
    double, single = double.to(dtype).eval(), single.to(dtype).eval()
    if contender.fused:
        single.fuse_projections()
    for block in (double, single):
        quantize_linears(
            block, contender.quantization, FLUX_FEATURES.gpu_quantization_ignored_layers
        )
    if contender.compiled:
        options = compile_options(torch.device(device))
        compile_counted(
            [double, single], kernels.counters, mode=options.mode, dynamic=False
        )
    return double, single, kernels


def block_inputs(shape: Shape, device: Any, dtype: Any) -> dict[str, Any]:
    import torch

    from diffserve.models.flux.embeddings import rope

    g = torch.Generator(device="cpu").manual_seed(1)
    side = int(shape.image_tokens**0.5)
    txt_ids = torch.zeros(shape.text_tokens, 3)
    rows = torch.arange(shape.image_tokens)
    img_ids = torch.stack((torch.zeros_like(rows), rows // side, rows % side), -1)
    pe = rope(torch.cat((txt_ids, img_ids.float())), shape.axes_dim, 10000)

    def randn(*size: int) -> Any:
        return torch.randn(*size, generator=g).to(device, dtype)

    return {
        "img": randn(1, shape.image_tokens, shape.hidden),
        "txt": randn(1, shape.text_tokens, shape.hidden),
        "vec": randn(1, shape.hidden),
        "pe": pe.to(device),
    }


def time_call(call: Callable[[], Any], iters: int, cuda: bool) -> float:
    """Median seconds of one call after warm-up (CUDA events on a GPU)."""
    import torch

    for _ in range(3):
        call()
    samples = []
    for _ in range(iters):
        if cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            call()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            call()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def top_kernels(call: Callable[[], Any], cuda: bool, count: int = 10) -> list[str]:
    """The profiler's most expensive kernels of a few calls, one line each."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(3):
            call()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=count)
    return table.splitlines()


def measure(
    contender: Contender, shape: Shape, args: argparse.Namespace, device: str
) -> dict[str, Any]:
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    double, single, kernels = build_blocks(contender, shape, device, dtype)
    x = block_inputs(shape, device, dtype)
    joint = torch.cat((x["txt"], x["img"]), dim=1)
    cuda = device == "cuda"

    def run_double() -> Any:
        return double(x["img"], x["txt"], x["vec"], x["pe"])

    def run_single() -> Any:
        return single(joint, x["vec"], x["pe"], shape.text_tokens)

    with torch.inference_mode():
        compile_started = time.perf_counter()
        run_double(), run_single()
        if cuda:
            torch.cuda.synchronize()
        first_call_s = time.perf_counter() - compile_started
        double_s = time_call(run_double, args.iters, cuda)
        single_s = time_call(run_single, args.iters, cuda)
    image_s = args.steps * (DOUBLE_BLOCKS * double_s + SINGLE_BLOCKS * single_s)
    return {
        "contender": contender.name,
        "status": "ok",
        "attention": {n: b.name for n, b in kernels.attention_backends.items()},
        "double_ms": double_s * 1e3,
        "single_ms": single_s * 1e3,
        "projected_image_s": image_s,
        "first_call_s": first_call_s,
        "profile": (run_double, run_single),
    }


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_blocks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS-GPU-BLOCKS.md")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--smoke", action="store_true", help="toy widths on the CPU")
    args = parser.parse_args(argv)
    if args.smoke and args.out == HERE / "RESULTS-GPU-BLOCKS.md":
        parser.error("--smoke never overwrites the GPU report: pass --out")
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu_blocks: no CUDA device here; nothing measured")
        return 2
    shape = SMOKE if args.smoke else FLUX_DEV_1024
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for contender in contenders(args.smoke):
        if time.perf_counter() - started > args.budget_s:
            rows.append({"contender": contender.name, "status": "not run (budget)"})
            continue
        try:
            rows.append(measure(contender, shape, args, device))
        except Exception as exc:  # noqa: BLE001 - one contender must not lose the rest
            status = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
            rows.append({"contender": contender.name, "status": status})
        if device == "cuda":
            torch.cuda.empty_cache()
        print(f"[blocks] {contender.name}: {rows[-1]['status']}", flush=True)
    measured = [r for r in rows if r["status"] == "ok"]
    profile: list[str] = []
    if measured:
        best = min(measured, key=lambda r: r["projected_image_s"])
        run_double, run_single = best["profile"]
        with torch.inference_mode():
            profile = [f"fastest: {best['contender']} (double block, then single)"]
            profile += top_kernels(run_double, device == "cuda")
            profile += top_kernels(run_single, device == "cuda")
    write(args, shape, device, rows, profile, time.perf_counter() - started)
    return 0


def write(
    args: argparse.Namespace,
    shape: Shape,
    device: str,
    rows: list[dict[str, Any]],
    profile: list[str],
    total_s: float,
) -> None:
    import torch

    card = (
        f"{torch.cuda.get_device_name(0)}, compute capability "
        f"{'.'.join(map(str, torch.cuda.get_device_capability(0)))}"
        if device == "cuda"
        else "CPU (smoke: toy widths, float32, wall clock)"
    )
    lines = [
        "# FLUX.1-dev blocks on one GPU",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by "
        f"`python -m benchmarks.gpu_blocks` in {total_s:.0f} s; {card}; "
        f"torch {torch.__version__}.",
        "",
        f"hidden {shape.hidden}, {shape.heads} heads, {shape.image_tokens} image + "
        f"{shape.text_tokens} text tokens, batch 1; median of {args.iters} calls after "
        f"warm-up; projected image = {args.steps} steps x ({DOUBLE_BLOCKS} double + "
        f"{SINGLE_BLOCKS} single blocks).",
        "",
        "| contender | status | attention | double ms | single ms | projected s/image "
        "| first call s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["status"] != "ok":
            lines.append(f"| {row['contender']} | {row['status']} | | | | | |")
            continue
        attention = ", ".join(sorted(set(row["attention"].values())))
        lines.append(
            f"| {row['contender']} | ok | {attention} | {row['double_ms']:.2f} | "
            f"{row['single_ms']:.2f} | {row['projected_image_s']:.3f} | "
            f"{row['first_call_s']:.1f} |"
        )
    lines += ["", "Top kernels:", "", "```", *profile, "```", ""]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    plain = [{k: v for k, v in r.items() if k != "profile"} for r in rows]
    args.out.with_suffix(".json").write_text(
        json.dumps({"rows": plain, "total_s": total_s}, indent=2), encoding="utf-8"
    )
    print(f"[blocks] wrote {args.out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
