"""The issue's targets, read off the measured metrics: measured value, target,
met/missed, and a note.

A target whose inputs were not measured (smoke mode, or a section that was not
available) is "not measured", never "met".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.mixed_targets import mixed_targets
from benchmarks.section import Section
from benchmarks.settings import Settings
from benchmarks.video_targets import video_targets

MIN_PSNR_DB = 40.0


@dataclass
class Target:
    name: str
    target: str
    measured: str = "not measured"
    status: str = "not measured"  # "met" | "missed" | "not measured"
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Targets that depend on the CPU kind (machine.cpu_capability): on AMX (bfloat16 GEMMs
# 4-8x float32) the bfloat16 step is judged against the true AMX peak (the best over
# sizes and backends, matmul_peak.py), and the default-dtype end-to-end target asks for
# more than on AVX512-BF16, where bfloat16 is about 2x float32.
STEP_BF16_LIMIT = {"AMX": 0.60}
DEFAULT_DTYPE_LIMIT = {"AMX": 0.55}


def evaluate(
    sections: list[Section], settings: Settings, cpu_kind: str = ""
) -> list[Target]:
    m: dict[str, Any] = {}
    for section in sections:
        m.update(section.metrics)
    out: list[Target] = []
    for dtype in ("float32", "bfloat16"):
        for mode, limit in (("compile", 0.80), ("eager", 0.95)):
            out.append(_latency(m, dtype, mode, limit))
    out.append(_default_dtype(m, DEFAULT_DTYPE_LIMIT.get(cpu_kind, 0.80)))
    for dtype, limit in (
        ("float32", 0.85),
        ("bfloat16", STEP_BF16_LIMIT.get(cpu_kind, 0.75)),
    ):
        out.append(_step(m, dtype, limit))
    out.append(
        _at_most(
            m,
            "overhead.mp.extra",
            "mp executor overhead vs uni (small-flux 256x256)",
            0.05,
            pct=True,
        )
    )
    out.append(
        _at_most(
            m,
            "overhead.http.extra",
            "HTTP overhead vs in-process uni (small-flux 256x256)",
            0.10,
            pct=True,
        )
    )
    out.append(_throughput(m, settings))
    out.append(
        _at_most(
            m,
            "replicas.ray.extra",
            "ray executor overhead vs uni in-process (one request)",
            0.05,
            pct=True,
        )
    )
    out.append(
        _at_most(
            m,
            "cold.generate_default.ratio",
            "cold start: diffserve generate / diffusers script (tiny-flux)",
            0.80,
            extra=_cold_note(m),
        )
    )
    out.append(
        _at_most(
            m,
            "cold.generate_default.rss_ratio",
            "peak RSS: diffserve generate / diffusers script (tiny-flux)",
            1.00,
        )
    )
    out.append(
        _at_most(
            m,
            "cold.compile_second.vs_eager",
            "cold start: second compiled start / eager start "
            "(tiny-flux, compile cache warm)",
            1.20,
            extra=_compile_note(m),
        )
    )
    out += _step_cache(m, settings)
    out.append(_arrivals(m, settings))
    out += _generic(m, settings)
    out += _quantization(m, settings)
    out += video_targets(m, settings)
    out += mixed_targets(m, settings)
    notes = {**NOTES, **NOTES_BY_KIND.get(cpu_kind, {})}
    for t in out:
        if t.status == "missed" and t.name in notes:
            t.note = (
                f"{t.note.rstrip('.')}. {notes[t.name]}" if t.note else notes[t.name]
            )
    return out


def _latency(m: dict[str, Any], dtype: str, mode: str, limit: float) -> Target:
    key = f"e2e.small-flux.256.4.{dtype}.{mode}"
    t = Target(
        f"small-flux 256x256/4 {dtype} {mode}: diffserve / diffusers latency",
        f"<= {limit:.2f} with PSNR >= {MIN_PSNR_DB:.0f} dB",
    )
    ratio, quality = m.get(f"{key}.ratio"), m.get(f"{key}.psnr_db")
    if ratio is None:
        return t
    t.measured = f"{ratio:.3f} (PSNR {_db(quality)})"
    psnr_ok = quality is not None and quality >= MIN_PSNR_DB
    t.status = "met" if ratio <= limit and psnr_ok else "missed"
    if not psnr_ok:
        t.note = (
            f"output differs from diffusers' (PSNR {_db(quality)} "
            f"< {MIN_PSNR_DB:.0f} dB)."
        )
    return t


# Parity bar per dtype for the default-dtype target: the same kernels in float32,
# bfloat16 rounding otherwise.
DEFAULT_DTYPE_PSNR_DB = {"float32": 90.0, "bfloat16": 45.0}


def _default_dtype(m: dict[str, Any], limit: float = 0.80) -> Target:
    """small-flux eager in the dtype this machine's deployments get by default (platform
    default)."""
    dtype = m.get("e2e.default_dtype")
    t = Target(
        "small-flux 256x256/4 eager in the machine's default "
        f"dtype ({dtype or 'unknown'}): "
        "diffserve / diffusers latency",
        f"<= {limit:.2f} with "
        f"PSNR >= {DEFAULT_DTYPE_PSNR_DB.get(dtype or '', 45.0):.0f} "
        "dB",
    )
    key = f"e2e.small-flux.256.4.{dtype}.eager"
    ratio, quality = m.get(f"{key}.ratio"), m.get(f"{key}.psnr_db")
    if dtype is None or ratio is None:
        return t
    bar = DEFAULT_DTYPE_PSNR_DB[dtype]
    t.measured = f"{ratio:.3f} (PSNR {_db(quality)})"
    psnr_ok = quality is not None and quality >= bar
    t.status = "met" if ratio <= limit and psnr_ok else "missed"
    if not psnr_ok:
        t.note = f"output differs from diffusers' (PSNR {_db(quality)} < {bar:.0f} dB)."
    return t


def _quantization(m: dict[str, Any], settings: Settings) -> list[Target]:
    """Section m: int8's weight bytes against bfloat16's, and int8 end to end against
    the default dtype."""
    case = settings.quant_case
    bytes_t = Target(
        f"{case.label} int8: transformer weight bytes / bfloat16's", "<= 0.55"
    )
    speed_t = Target(
        f"{case.label} int8 in the default dtype: s/image / "
        "unquantized (CPU with AMX-INT8 or VNNI)",
        "< 1.00",
    )
    if case.model != "small-flux":
        return [bytes_t, speed_t]
    default = "bfloat16" if "quant.bfloat16.int8.ratio" in m else "float32"
    ratio = m.get(f"quant.{default}.int8.bytes_vs_bf16")
    if ratio is not None:
        bytes_t.measured, bytes_t.status = (
            f"{ratio:.3f}",
            "met" if ratio <= 0.55 else "missed",
        )
    speed = m.get(f"quant.{default}.int8.ratio")
    if speed is not None:
        speed_t.measured = (
            f"{speed:.3f} ({default}; "
            f"float32: {m.get('quant.float32.int8.ratio', float('nan')):.3f})"
        )
        speed_t.status = "met" if speed < 1.0 else "missed"
    return [bytes_t, speed_t]


def _generic(m: dict[str, Any], settings: Settings) -> list[Target]:
    """Section j: the generic path's parity with plain diffusers (the same kernels run),
    latency beside it."""
    out = []
    for case in settings.generic_cases:
        for dtype in settings.dtypes:
            key = f"generic.{case.model}.{case.size}.{case.steps}.{dtype}"
            bar = GENERIC_PSNR_DB[dtype]
            t = Target(
                f"generic path {case.label} {dtype}: image vs plain diffusers",
                f"PSNR >= {bar:.0f} dB",
            )
            quality, ratio = m.get(f"{key}.psnr_db"), m.get(f"{key}.ratio")
            if quality is not None:
                t.measured = _db(quality)
                t.status = "met" if quality >= bar else "missed"
                t.note = (
                    f"latency diffserve / diffusers {ratio:.3f} (no latency "
                    "target: the same pipeline code runs)."
                )
            out.append(t)
    return out


GENERIC_PSNR_DB = {"float32": 60.0, "bfloat16": 40.0, "float16": 40.0}


def _step(m: dict[str, Any], dtype: str, limit: float) -> Target:
    t = Target(
        f"transformer step {dtype}: fraction of measured matmul peak", f">= {limit:.0%}"
    )
    frac = m.get(f"step.{dtype}.diffserve.frac_peak")
    if frac is None:
        return t
    t.measured = f"{frac:.0%}"
    t.status = "met" if frac >= limit else "missed"
    ref = m.get(f"step.{dtype}.diffusers.frac_peak")
    shape = m.get(f"step.{dtype}.shape_gemm_gflops", 0.0) / max(
        m.get(f"step.{dtype}.peak_gflops", 1.0), 1e-9
    )
    backend = m.get(f"step.{dtype}.peak_backend")
    t.note = (
        f"diffusers: {ref:.0%}; one GEMM at the model's own "
        f"shape reaches {shape:.0%} of the peak "
        f"(peak {m.get(f'step.{dtype}.peak_gflops', 0):.1f} GFLOP/s: "
        + (backend if backend else f"n={m.get(f'step.{dtype}.peak_size')}")
        + ")."
    )
    return t


def _throughput(m: dict[str, Any], settings: Settings) -> Target:
    clients = max(settings.clients)
    t = Target(
        f"{clients} concurrent clients (small-flux 128x128/2): "
        "images/s vs sequential diffusers",
        ">= 1.50x",
    )
    best = {
        b: m.get(f"throughput.diffserve.c{clients}.b{b}.vs_diffusers")
        for b in settings.batch_sizes
    }
    best = {b: v for b, v in best.items() if v is not None}
    if not best or settings.smoke:
        return t
    batch, value = max(best.items(), key=lambda kv: kv[1])
    t.measured = f"{value:.2f}x (max_batch_size {batch})"
    t.status = "met" if value >= 1.5 else "missed"
    t.note = "; ".join(f"max_batch_size {b}: {v:.2f}x" for b, v in best.items())
    return t


def _at_most(
    m: dict[str, Any],
    key: str,
    name: str,
    limit: float,
    *,
    pct: bool = False,
    extra: Callable[[], str] | str = "",
) -> Target:
    t = Target(name, f"<= {limit:+.0%}" if pct else f"<= {limit:.2f}")
    value = m.get(key)
    if value is None:
        return t
    t.measured = f"{value:+.1%}" if pct else f"{value:.2f}"
    t.status = "met" if value <= limit else "missed"
    t.note = extra() if callable(extra) else extra
    return t


def _step_cache(m: dict[str, Any], settings: Settings) -> list[Target]:
    """Section h: our First-Block Cache against cache-dit's DBCache F1B0 on diffusers
    (small-flux, 28 steps)."""
    label = (
        f"{settings.cache_case.model} "
        f"{settings.cache_case.size}x{settings.cache_case.size}/"
        f"{settings.cache_case.steps}"
    )
    speed = Target(
        f"step cache {label}: speed-up at equal PSNR / cache-dit's",
        ">= 1.00 at every cache-dit threshold that skips (ours "
        "interpolated at its PSNR)",
    )
    latency = Target(
        f"step cache {label}: diffserve / diffusers+cache-dit "
        "latency, uncached and cached",
        "< 1.00 uncached and at every threshold",
    )
    if settings.smoke:
        return [speed, latency]
    ratio = m.get("cache.equal_psnr.min_ratio")
    if ratio is not None:
        speed.measured = f"{ratio:.2f} (worst threshold)"
        speed.status = "met" if ratio >= 1.0 else "missed"
        speed.note = m.get("cache.equal_psnr.detail", "")
    elif m.get("cache.equal_psnr.detail"):
        speed.note = m["cache.equal_psnr.detail"]
    worst = m.get("cache.latency.max_ratio")
    if worst is not None:
        latency.measured = f"{worst:.2f} (worst point)"
        latency.status = "met" if worst < 1.0 else "missed"
        latency.note = m.get("cache.latency.detail", "")
    return [speed, latency]


def _arrivals(m: dict[str, Any], settings: Settings) -> Target:
    """Section i: at the high load level both batching modes serve the same Poisson
    trace, so at the same throughput step-level batching must have the lower p95 latency
    (the step engine may not buy it with fewer images/s: it must keep at least 95% of
    request-level batching's)."""
    case = settings.arrivals_case
    high = settings.arrivals_loads[-1]
    t = Target(
        f"Poisson arrivals {case.model} {case.size}x{case.size}/{case.steps} "
        f"at {high:g}x sequential "
        "capacity: p95 latency, step- / request-level batching",
        "< 1.00 at the same images/s",
    )
    if settings.smoke:
        return t
    ratio = m.get("arrivals.high.p95_ratio")
    step, request = (
        m.get("arrivals.high.step.p95_s"),
        m.get("arrivals.high.request.p95_s"),
    )
    rate_step, rate_request = (
        m.get("arrivals.high.step.images_per_s"),
        m.get("arrivals.high.request.images_per_s"),
    )
    if ratio is None or None in (step, request, rate_step, rate_request):
        return t
    same_rate = rate_step >= 0.95 * rate_request
    t.measured = f"{ratio:.2f}"
    t.status = "met" if ratio < 1.0 and same_rate else "missed"
    t.note = (
        f"p95 {step:.2f} s vs {request:.2f} s; images/s {rate_step:.2f} "
        f"vs {rate_request:.2f}"
        + ("" if same_rate else " (step-level below 95% of request-level's throughput)")
        + (
            f"; diffusers sequential p95 {m['arrivals.high.diffusers.p95_s']:.2f} s"
            if m.get("arrivals.high.diffusers.p95_s") is not None
            else ""
        )
        + "."
    )
    if t.status == "missed":
        t.note += (
            " Bound: on 2 CPU cores a batch of b requests costs "
            "close to b times one (one request already "
            "keeps both cores busy; section d), so a newcomer that "
            "joins slows every running request about "
            "as much as it gains: step-level batching then acts "
            "as processor sharing, whose tail is worse "
            "than first-come-first-served for equal-size jobs. "
            "It pays where batching makes an image "
            "cheaper (accelerators, larger GEMMs); a join policy "
            "that weighs that gain is not built yet."
        )
    return t


def _compile_note(m: dict[str, Any]) -> str:
    first, second, eager = (
        m.get(f"cold.{k}.s")
        for k in ("compile_first", "compile_second", "generate_eager")
    )
    if None in (first, second, eager):
        return ""
    return (
        f"first compiled start {first:.1f} s, second {second:.1f} "
        f"s, eager {eager:.1f} s"
    )


def _cold_note(m: dict[str, Any]) -> str:
    eager = m.get("cold.generate_eager.ratio")
    ready = m.get("cold.serve.ready_s")
    parts = []
    if eager is not None:
        parts.append(f"with --enforce-eager: {eager:.2f}")
    if ready is not None:
        parts.append(f"serve to /ready {ready:.1f}s")
    return "; ".join(parts)


def _db(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "identical" if value == float("inf") else f"{value:.1f} dB"


# What was tried and what bounds a missed target, from the authoritative run's numbers
# and profiles. Keyed by Target.name; shown only for missed targets (after the measured
# context note).
_GEMM_BOUND = (
    "Tried: diffserve eager (fused QKV and linear1, RoPE "
    "table once per request) and compile (per-block "
    "torch.compile, dynamic shapes). Bound: both engines "
    "spend almost all of the step in the same torch "
    "GEMMs (F.linear -> oneDNN/MKL sgemm, section b); fusion "
    "and compile only shrink the non-GEMM rest, "
    "so the ratio cannot drop much below the GEMM share "
    "of a step without faster GEMMs (larger M by "
    "batching, prepacked weights)."
)
_BF16_BOUND = (
    "Bound, on an AVX2-only CPU (no AVX512-BF16/AMX; see "
    "the machine's cpu_capability): bfloat16 GEMMs and "
    "VAE convolutions run through conversions at a fraction "
    "of float32 speed in both engines; the VAE "
    "decode alone is about half of a bfloat16 image (phases "
    "in section a). On an AVX512-BF16 CPU: the "
    "GEMMs (onednn, prepacked) reach about 91% of the bfloat16 "
    "peak, and attention bounds the step: "
    "torch's CPU flash kernel runs at about 70 GFLOP/s "
    "per core at every length tried (about 30 of a "
    "180 ms small-flux step), so even GEMMs at 100% would "
    "leave the step near 84% of peak; a bmm-based "
    "attention is faster but rounds the scores to bfloat16 "
    "(about 5x the error), so it was not used."
)
_LAST_STEP = (
    "Bound: both engines see the same signals and skip "
    "the same steps (section notes), except that "
    "diffserve always computes the last step (the cache's "
    "rule, for quality) where cache-dit may skip it: "
    "at thresholds that skip most steps that one full step "
    "(about 0.44 s of a 2.5-3 s image here) is the "
    "whole gap; at thresholds up to 0.6 diffserve is ahead "
    "or level. Uncached, both run the same float32 "
    "GEMMs at the same rate (section b: the step is at "
    "parity), so lower latency needs a faster full "
    "step (bfloat16 where the CPU has it, fewer non-GEMM kernels)."
)
NOTES: dict[str, str] = {
    "step cache small-flux 256x256/28: speed-up at equal "
    "PSNR / cache-dit's": _LAST_STEP,
    "step cache small-flux 256x256/28: diffserve / diffusers+cache-dit "
    "latency, uncached and cached": _LAST_STEP,
    "small-flux 256x256/4 float32 compile: diffserve / diffusers latency": _GEMM_BOUND,
    "small-flux 256x256/4 float32 eager: diffserve / diffusers latency": _GEMM_BOUND,
    "small-flux 256x256/4 bfloat16 compile: diffserve / diffusers latency": _BF16_BOUND,
    "small-flux 256x256/4 bfloat16 eager: diffserve / diffusers latency": _BF16_BOUND,
    "transformer step float32: fraction of measured matmul peak": (
        "Bound: the step's GEMMs have M = 320 tokens and K "
        "= 768, where one GEMM already falls short of "
        "the large-square peak (the model-shape GEMM above); "
        "attention, norms, RoPE and activations "
        "add uncounted time. Compile (fusing the elementwise "
        "ops) is measured end to end in section a."
    ),
    "transformer step bfloat16: fraction of measured matmul peak": _BF16_BOUND,
    "mp executor overhead vs uni (small-flux 256x256)": (
        "The worker-side phases (section c notes) separate "
        "compute from transport: in runs on a loaded "
        "machine the mp worker's denoise itself ran slower "
        "than uni's (the worker process competes for "
        "the 2 cores with other processes), while pipe IPC "
        "of a 256x256 image is milliseconds."
    ),
    "8 concurrent clients (small-flux 128x128/2): images/s vs sequential diffusers": (
        "Bound: one request already keeps both cores busy (intra-op "
        "threads), so concurrency adds no "
        "compute; only batching helps, by raising GEMM M from "
        "128 to up to 4 x 128 tokens (executed "
        "batch sizes in section d). 1.5x would need a batched "
        "step 1.5x more efficient per image."
    ),
    "cold start: diffserve generate / diffusers script (tiny-flux)": (
        "Bound: imports. Starting Python and importing torch, "
        "transformers' T5 and CLIP models and "
        "diffusers' VAE takes 3.2 s on the 2-core AVX512 machine "
        "(364 MiB), about 73% of the diffusers "
        "script's whole run, which both processes pay; the "
        "first image's own work (load, encoders, 2 steps, "
        "VAE decode, first-call costs) is 0.6-0.8 s. generate "
        "already skips the interpreter's teardown "
        "(0.8 s) and pydantic; 0.8x needs text encoders, tokenizers "
        "and a VAE decoder that do not import "
        "transformers or diffusers."
    ),
    "peak RSS: diffserve generate / diffusers script (tiny-flux)": (
        "Both processes hold the same libraries (364 MiB imported "
        "before any weight) and the same tiny "
        "weights. The difference is the onednn linear backend "
        "(auto on AVX512 CPUs), which keeps a packed "
        "copy of every called weight plus oneDNN's primitive "
        "cache (about 14 MiB: --linear-backend torch "
        "peaks at 436 MiB against 451), and diffserve's engine "
        "and config modules and threads (a few MiB)."
    ),
    "cold start: second compiled start / eager start (tiny-flux, compile cache warm)": (
        "Bound: what torch does not cache. A second start hits "
        "the AOTAutograd and FX graph caches (no "
        "inductor compile) and skips the SIMD probe (0.94 s "
        "-> 0.14 s), but still imports inductor's "
        "compile path (0.8 s on 2 cores: already the whole "
        "1.2x budget of 0.2 x ~4 s) and re-traces the two "
        "block classes with dynamo (dynamic shapes) before "
        "loading their cached graphs (about 2 s). "
        "Tried: torch's caching_precompile (TORCH_CACHING_PRECOMPILE, "
        "which caches the trace too) fails on "
        "the second start (\"Name '__builtins_dict___0' already exists in scope\"); "
        "torch.compile(...).aot_compile with save_compiled_function "
        "skips the trace (loading both blocks "
        "takes about 1.7 s, imports included) but its guards "
        "reject the next start's inference-mode "
        "tensors (dispatch key mismatch) unless guard checks "
        "are disabled, which is unsafe; dynamic=False "
        "traces no faster. On real FLUX the fixed 3 s stays "
        "while the eager start grows with the weights."
    ),
}

# Where a CPU kind's bound differs from the general note (keyed by
# machine.cpu_capability, then Target.name).
_AMX_STEP = (
    "Bound, on AMX (profiled per small-flux 256x256 forward, "
    "about 62 ms under the profiler): the GEMMs take about "
    "42 ms at 1.2-2.0 TFLOP/s, where the best square reaches "
    "2.0: the MLP up-projections with the tanh-GELU "
    "fused in oneDNN's epilogue run at about 1.2 TFLOP/s "
    "(the epilogue is about 45% of their time: 0.86 vs "
    "0.59 ms at [320x768]x[768x3072]; an unfused bfloat16 "
    "GELU is slower still, 1.6 ms), the 64-token text "
    "stream GEMMs at about 0.7 TFLOP/s, and the per-image "
    "modulation GEMVs (M = 1, about 45M weights read "
    "every step: about 5 ms at the machine's 17-25 GB/s) "
    "are memory-bound; attention is torch's flash kernel, "
    "which already runs its two GEMMs on AMX (oneDNN brgemm, "
    "float32 accumulation of the scores) at about 570 "
    "GFLOP/s (the rows above, with its error against float64 "
    "beside the math backend's), about 8 ms; layer "
    "norms, modulation, QK-norm/RoPE and copies about 12 "
    "ms. Next levers, not built: the modulation vectors "
    "of every step of a request in one GEMM (its weights "
    "read once per request instead of once per step) "
    "and fused non-GEMM ops (compile with inductor's weight freezing)."
)
NOTES_BY_KIND: dict[str, dict[str, str]] = {
    "AMX": {
        "transformer step bfloat16: fraction of measured matmul peak": _AMX_STEP,
        "small-flux 256x256/4 eager in the machine's default "
        "dtype (bfloat16): diffserve / diffusers latency": (
            "Bound: the transformer step (section b; about 0.28 "
            "s of diffserve's 0.34 s image is 4 steps of "
            "about 71 ms; decode about 50 ms, the same VAE as diffusers). "
            "0.55x would need a step of about 57 "
            "ms. " + _AMX_STEP
        ),
        "small-flux 256x256/4 bfloat16 compile: diffserve / diffusers latency": (
            "Bound: compiled blocks take inductor's own GEMMs on "
            "unpacked weights (weight freezing is off: "
            "parameters must stay loadable and LoRA-patchable), "
            "slower in bfloat16 on AMX than the eager "
            "path's prepacked oneDNN inner products (eager 0.66x here)."
        ),
        "small-flux 256x256/4 steps int8 in the default dtype: "
        "s/image / unquantized (CPU with AMX-INT8 or VNNI)": (
            "Bound: torchao's CPU int8 path (per-token activation "
            "quantization, then torch._int_mm on an unpacked "
            "weight, then rescaling, three passes per Linear) against "
            "bfloat16 GEMMs that run on AMX tiles on "
            "prepacked weights with the bias and GELU in the epilogue. "
            "Measured at [320x768]x[768x3072] on 2 "
            "cores: bfloat16 oneDNN packed 0.69 ms, torchao int8 "
            "dynamic 2.29 ms (bfloat16 activations) and 1.91 "
            "ms (float32, where it is 2.1x faster than float32's "
            "4.06 ms); oneDNN's own int8 inner product "
            "(onednn.qlinear_pointwise, AMX-INT8, prepacked) 0.45 "
            "ms with one activation scale per tensor. Next "
            "lever, not built: an int8 backend on that kernel with "
            "per-token scales applied in its float32 "
            "output (about 0.75 ms with the quantization and rescale "
            "passes: at par with bfloat16, so the win on "
            "this machine stays memory, 0.51x the bytes)."
        ),
    }
}
