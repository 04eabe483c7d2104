"""How much each measurement does in full and smoke mode.

Full mode is sized to finish in under 15 minutes on the 2-core CPU machine; smoke mode
(CI) uses the tiny model only with a couple of iterations so the harness cannot rot, and
its numbers mean nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROMPT = "a red fox in the snow, watercolor"
SEED = 42
# The same text length for every contender; FLUX pads the T5 prompt to this many tokens.
MAX_SEQUENCE_LENGTH = 64
# FLUX's default. The benchmark models are schnell-like (no guidance embedding, no true
# CFG), so both engines run one transformer forward per step whatever this is; it is
# passed for identical requests.
GUIDANCE_SCALE = 3.5


@dataclass(frozen=True)
class Case:
    """One image-generation workload: which model, image size and denoise steps."""

    # "tiny-flux" | "small-flux" | ... ("toy-shapes"/"toy-motion": the trained toy
    # models, l and q)
    model: str
    size: int  # square images, pixels per side
    steps: int

    @property
    def label(self) -> str:
        return f"{self.model} {self.size}x{self.size}/{self.steps} steps"


@dataclass(frozen=True)
class Settings:
    smoke: bool
    warmup: int  # untimed calls per contender before timing
    iters: int  # timed calls per contender (the median is reported)
    e2e_cases: tuple[Case, ...]
    dtypes: tuple[str, ...]
    # Compiled diffserve is a third contender in these models' end-to-end cases (compile
    # is slow on 2 cores, so it is measured where the target asks for it: small-flux).
    compile_models: tuple[str, ...]
    step_case: Case  # transformer step alone
    step_iters: int
    matmul_size: int
    overhead_case: Case  # mp vs uni, HTTP vs in-process
    throughput_case: Case
    clients: tuple[int, ...]
    batch_sizes: tuple[int, ...]  # max_batch_size: 1 = batching off
    # Images per (clients, batch size) point, split evenly over the clients.
    throughput_images: int
    throughput_eager: bool
    # Every point is measured this many times, interleaved; the median counts.
    throughput_rounds: int
    cold_case: Case
    cold_repeats: int
    # Also time `diffserve generate --no-enforce-eager`: its first start (empty compile
    # cache) once, and its second start (compile cache warm) cold_repeats times.
    cold_compile: bool
    models: tuple[str, ...] = field(default=("tiny-flux", "small-flux"))
    # Seconds of timed calls one case may use after its first round (None: always
    # ``iters``).
    case_budget_s: float | None = None
    # Step cache vs cache-dit (section h): the case and the thresholds swept on both
    # engines. On the random-weight benchmark models block 0's residual changes by ~0.5
    # relative per step, so the published FBCache default 0.08 never skips; these
    # straddle that signal.
    cache_case: Case = Case("small-flux", 256, 28)
    cache_thresholds: tuple[float, ...] = (0.55, 0.6, 0.65, 0.7, 0.75)
    # Step-level vs request-level batching under Poisson arrivals (section i): the case,
    # the requests per contender, level and round (one seeded trace), the load levels as
    # fractions of the sequential capacity 1/S (S: the slower engine's single-request
    # time) and max_batch_size in both modes.
    arrivals_case: Case = Case("tiny-flux", 128, 10)
    arrivals_requests: int = 40
    arrivals_loads: tuple[float, ...] = (0.5, 0.9)
    arrivals_batch: int = 4
    # Every level runs the trace this many times per contender, order reversed.
    arrivals_rounds: int = 2
    # Mixed traffic (section s): requests drawn from mixed_sizes x mixed_steps x cache
    # thresholds {0, mixed_threshold} (fbcache on) x adapters {none, A, B} on one model;
    # an open loop (one Poisson trace of mixed_requests, at mixed_load x 1/S, S: the
    # slowest contender's mean time alone over the mix's first mixed_service requests)
    # and a closed loop of mixed_clients clients over mixed_closed_requests, each run
    # mixed_rounds times; max_batch_size mixed_batch in every engine. The open loop's
    # engines keep batch_invariant's default (true) in both modes; the closed loop's
    # step-level engine (the target's contender) runs with mixed_batch_invariant, and
    # with mixed_closed_both the open loop's step engine runs the closed loop too.
    mixed_model: str = "tiny-flux"
    mixed_sizes: tuple[int, ...] = (64, 128, 192, 256)
    mixed_steps: tuple[int, ...] = (4, 8)
    mixed_threshold: float = 0.6
    mixed_requests: int = 48
    mixed_load: float = 0.9
    mixed_service: int = 12
    mixed_clients: int = 8
    mixed_closed_requests: int = 32
    mixed_rounds: int = 2
    mixed_batch: int = 8
    # max_step_tokens of every engine: the cost-aware budget, about where batching
    # stops paying on a CPU (one 128x128 image's 64 tokens a step): small requests
    # batch, larger ones run (nearly) alone instead of slowing what shares their step.
    mixed_step_tokens: int = 64
    mixed_batch_invariant: bool = False
    mixed_closed_both: bool = True
    # The generic path (section j): SD3 on diffusers' own pipeline class with our
    # kernels, vs that pipeline.
    generic_cases: tuple[Case, ...] = (
        Case("tiny-sd3", 128, 4),
        Case("small-sd3", 256, 4),
    )
    # Qwen-Image-2.1 (section t): the generic path vs diffusers, and the profile that
    # bounds what a native path could gain.
    qwen21_case: Case = Case("small-qwen-image-21", 256, 4)
    # Per-request LoRA (section k): one adapter vs the base per image; 8 clients with 4
    # adapters vs base.
    lora_case: Case = Case("small-flux", 256, 4)
    lora_images: int = 16
    # Step cache on the trained toy-shapes model against its random twin (section l):
    # the case (64x64 is the model's size; 28 steps, FLUX.1-dev's default, where the
    # published thresholds were tuned), the held-out prompt/seed pairs per point and
    # each backend's thresholds (0 = uncached is always added).
    cache_trained_case: Case = Case("toy-shapes", 64, 28)
    cache_trained_pairs: int = 8
    cache_trained_fbcache: tuple[float, ...] = (0.05, 0.08, 0.15, 0.3, 0.5)
    cache_trained_teacache: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
    # Quantized weights (section m): the case and the methods, unquantized first (the
    # reference).
    quant_case: Case = Case("small-flux", 256, 4)
    quant_methods: tuple[str, ...] = (
        "none",
        "int8",
        "int8_weight_only",
        "fp8_weight_only",
    )
    # Stages at runtime (section n): the case and the images per throughput round (over
    # 8 clients).
    stages_case: Case = Case("small-flux", 256, 4)
    stages_images: int = 16
    # Video (section o): native Wan vs diffusers' WanPipeline (CFG 5.0) at these frame
    # counts (4k+1).
    video_case: Case = Case("small-wan", 256, 4)
    video_frames: tuple[int, ...] = (9, 17)
    # Tracing (section p): HTTP latency with OpenTelemetry on vs off, in blocks of
    # requests alternating off/on.
    tracing_case: Case = Case("tiny-flux", 128, 2)
    tracing_rounds: int = 6
    tracing_block: int = 5
    # Step cache on the trained toy video model against its random twin (section q): the
    # case (64x64 and 17 frames are the model's; 24 steps, twice its default 12, so a
    # sweep has steps to skip), the held-out pairs per point and each backend's
    # thresholds (0 = uncached is always added). teacache runs Wan2.1-T2V-1.3B's
    # polynomial, whose published 0.05/0.08 skip nothing here: its rescaled value is
    # ~0.22 per step on the trained model (so 0.3/0.5/0.8 skip about one, two, three
    # steps per computed one) and in the hundreds on the random twin (it never skips).
    cache_video_case: Case = Case("toy-motion", 64, 24)
    cache_video_pairs: int = 8
    cache_video_fbcache: tuple[float, ...] = (0.05, 0.08, 0.15, 0.3, 0.5)
    cache_video_teacache: tuple[float, ...] = (0.08, 0.3, 0.5, 0.8)
    # The AR stage (section r): the toy prompter on vLLM against transformers' generate
    # (one prompt, then a batch of ar_batch; ar_iters timed calls each, milliseconds
    # apiece), end to end in front of toy-shapes (ar_requests short prompts, ar_passes
    # timed passes over them per contender), and with ar_mp the start of a vLLM engine
    # on the mp executor (~15-20 s on 2 cores).
    ar_batch: int = 8
    ar_iters: int = 20
    ar_requests: int = 8
    ar_passes: int = 2
    ar_mp: bool = True


TINY_E2E = Case("tiny-flux", 128, 2)
SMALL_E2E = Case("small-flux", 256, 4)

FULL = Settings(
    smoke=False,
    warmup=1,
    iters=5,
    e2e_cases=(TINY_E2E, SMALL_E2E),
    dtypes=("float32", "bfloat16"),
    compile_models=("small-flux",),
    step_case=SMALL_E2E,
    step_iters=10,
    # the peak is the best of 512² .. 4096² (AMX bfloat16 peaks above 2048²)
    matmul_size=4096,
    overhead_case=SMALL_E2E,
    throughput_case=Case("small-flux", 128, 2),
    clients=(1, 4, 8),
    batch_sizes=(1, 4),
    throughput_images=8,
    throughput_eager=True,
    throughput_rounds=2,
    cold_case=Case("tiny-flux", 128, 2),
    cold_repeats=3,
    cold_compile=True,
    case_budget_s=50.0,
)

SMOKE = Settings(
    smoke=True,
    warmup=0,  # the harness must run, its numbers mean nothing: one call per contender
    iters=1,
    e2e_cases=(TINY_E2E,),
    dtypes=("float32",),
    compile_models=(),
    step_case=TINY_E2E,
    step_iters=2,
    matmul_size=256,
    overhead_case=TINY_E2E,
    throughput_case=Case("tiny-flux", 128, 2),
    clients=(1, 2),
    batch_sizes=(1, 2),
    throughput_images=2,
    throughput_eager=True,
    throughput_rounds=1,
    cold_case=TINY_E2E,
    cold_repeats=1,
    cold_compile=False,
    models=("tiny-flux",),
    cache_case=Case("tiny-flux", 128, 8),
    cache_thresholds=(0.5, 0.7),
    arrivals_case=Case("tiny-flux", 128, 4),
    arrivals_requests=4,
    arrivals_loads=(0.9,),  # one level: the harness runs, the numbers mean nothing
    arrivals_rounds=1,
    mixed_sizes=(64, 128),
    mixed_steps=(2, 3),
    mixed_requests=6,
    mixed_service=2,
    mixed_closed_requests=8,
    mixed_rounds=1,
    # smoke: one closed loop, on the open loop's step engine (no third engine start)
    mixed_batch_invariant=True,
    mixed_closed_both=False,
    generic_cases=(Case("tiny-sd3", 64, 2),),
    qwen21_case=Case("tiny-qwen-image-21", 64, 2),
    lora_case=Case("tiny-flux", 64, 2),
    lora_images=8,
    cache_trained_case=Case("toy-shapes", 64, 8),
    cache_trained_pairs=1,
    cache_trained_fbcache=(0.3,),
    # smoke: fbcache only (the teacache path is the same code)
    cache_trained_teacache=(),
    quant_case=Case("tiny-flux", 64, 2),
    quant_methods=("none", "int8"),
    stages_case=Case("tiny-flux", 64, 2),
    stages_images=8,
    video_case=Case("tiny-wan", 64, 2),
    video_frames=(9,),
    tracing_case=Case("tiny-flux", 64, 2),
    tracing_rounds=1,
    tracing_block=1,
    cache_video_case=Case("toy-motion", 64, 4),
    cache_video_pairs=1,
    cache_video_fbcache=(0.3,),
    cache_video_teacache=(),  # smoke: fbcache only (the teacache path is the same code)
    ar_batch=2,
    ar_iters=1,
    ar_requests=1,
    ar_passes=1,
    ar_mp=False,  # smoke: uni only (mp's start is ~20 s)
)
