"""(i) Step-level batching under Poisson arrivals: p50/p95 latency and images/s of
diffserve with ``batching: step`` (requests join a running batch at a step boundary and
leave after their last step) against ``batching: request`` (a batch is formed once and
runs to its end) and sequential diffusers, at two load levels.

Open loop: one seeded trace of exponential inter-arrival times (unit rate, scaled to
each level's rate lambda) gives N arrival times; every request (n=1, same
prompt/size/steps, its own seed) is submitted at its arrival time whatever the earlier
ones are doing. Latency = completion - scheduled arrival; images/s = N / (last
completion - first arrival). Every contender gets the same trace.

- diffserve: in-process ``AsyncEngine`` (uni executor, eager, float32,
  ``max_batch_size`` 4), one
  asyncio task per request, created at its arrival time.
- sequential diffusers: one worker (this thread) drains the arrival-ordered FIFO with
  real
  ``FluxPipeline`` calls: request i starts at max(its arrival, the previous completion).

The levels are fractions of the sequential capacity 1/S, S being the slower of the two
engines' single-request times (median of a few calls alone after warm-up), so every
contender is stable at both levels; at the high level arrivals bunch up often enough for
request-level batching to form batches (the engine's running requests, sampled while
busy, are reported). Each level runs the trace ``arrivals_rounds`` times per contender,
the contenders' order reversed every round."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import contenders as C
from benchmarks.common import median, psnr
from benchmarks.section import Section
from benchmarks.settings import SEED, Case, Settings

DTYPE = "float32"
STEP, REQUEST, DIFFUSERS = (
    "diffserve batching=step",
    "diffserve batching=request",
    "diffusers sequential",
)
LEVEL_NAMES = ("low", "high")
# The first calls of a fresh engine/pipeline run slower (allocator, caches)
WARMUP_CALLS = 2
SERVICE_CALLS = 5  # single-request calls (after the warm-up) whose median is S
SEED0 = SEED + 1000  # request i of a trace has seed SEED0 + i


# -- the arrival trace and the statistics (pure, unit-tested without a model)
# -------------------------


def unit_trace(n: int, seed: int = SEED) -> np.ndarray:
    """Arrival offsets (s) of ``n`` requests of a rate-1 Poisson process, the first at
    0. Scale by 1/lambda."""
    gaps = np.random.default_rng(seed).exponential(1.0, size=max(n - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps)])


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between order statistics
    (numpy's default)."""
    return (
        float(np.percentile(np.asarray(values, dtype=np.float64), q))
        if values
        else float("nan")
    )


@dataclass
class Run:
    """One contender on one trace: per request, its arrival and completion (s from the
    trace start)."""

    arrivals: list[float]
    completions: list[float]
    # Requests per executed batch (engine stats), if any.
    batch_sizes: list[int] = field(default_factory=list)
    # Sampled requests running while busy, if any.
    running: list[int] = field(default_factory=list)
    # Kept outputs, by request index.
    images: dict[int, Any] = field(default_factory=dict)

    @classmethod
    def pool(cls, runs: list[Run]) -> Run:
        """Runs laid end to end (each shifted to start where the previous one's last
        request finished): the latencies are every run's, images/s is all images over
        the summed spans."""
        pooled = cls([], [])
        offset = 0.0
        for run in runs:
            shift = offset - min(run.arrivals)
            pooled.arrivals += [a + shift for a in run.arrivals]
            pooled.completions += [c + shift for c in run.completions]
            pooled.batch_sizes += run.batch_sizes
            pooled.running += run.running
            offset = max(pooled.completions)
        return pooled

    @property
    def latencies(self) -> list[float]:
        return [c - a for a, c in zip(self.arrivals, self.completions, strict=True)]

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50)

    @property
    def p95(self) -> float:
        return percentile(self.latencies, 95)

    @property
    def images_per_s(self) -> float:
        span = max(self.completions) - min(self.arrivals)
        return len(self.completions) / span if span > 0 else float("nan")

    @property
    def mean_batch(self) -> float | None:
        return statistics.fmean(self.batch_sizes) if self.batch_sizes else None

    @property
    def mean_running(self) -> float | None:
        return statistics.fmean(self.running) if self.running else None


# -- the measurement
# ------------------------------------------------------------------------------------


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.arrivals_case
    path = models[case.model]
    n, rounds = settings.arrivals_requests, max(1, settings.arrivals_rounds)
    section.columns = [
        "load",
        "lambda req/s",
        "contender",
        "requests",
        "p50 s",
        "p95 s",
        "max s",
        "images/s",
        "requests per engine batch",
        "mean running while busy",
    ]
    engines: dict[str, Any] = {}
    try:
        # The engines first: without the ``batching`` key there is nothing to compare.
        for name, mode in ((STEP, "step"), (REQUEST, "request")):
            engines[name] = _async_engine(path, mode, settings.arrivals_batch, n)
        recorders = {name: _Recorder(engine) for name, engine in engines.items()}
        one = _diffusers_call(C.load_diffusers(path, DTYPE), case)
        alone_calls: dict[str, Callable[[int], Any]] = {
            name: (lambda seed, engine=engine: _alone(engine, case, seed))
            for name, engine in engines.items()
        }
        alone_calls[DIFFUSERS] = one
        # Warm-up, then S: single requests alone, interleaved (the step engine's images
        # are also the "alone" references of the bit-identity check).
        for call in alone_calls.values():
            for _ in range(WARMUP_CALLS):
                call(SEED0)
        times: dict[str, list[float]] = {name: [] for name in alone_calls}
        alone: dict[int, Any] = {}
        for i in range(SERVICE_CALLS):
            for name, call in alone_calls.items():
                t0 = time.perf_counter()
                image = call(SEED0 + i)
                times[name].append(time.perf_counter() - t0)
                if name == STEP:
                    alone[i] = image
        service = {name: median(values) for name, values in times.items()}
        s = max(service.values())
        trace = unit_trace(n)
        section.notes.append(
            f"{case.label}, {DTYPE}, diffserve eager uni AsyncEngine, "
            f"max_batch_size {settings.arrivals_batch} in both "
            f"modes; {n} requests (n=1, seeds {SEED0}..{SEED0 + n - 1}) "
            "per contender, level and round, one Poisson "
            f"trace (seed {SEED}) scaled to each rate, {rounds} "
            "round(s) per level with the contenders' order "
            "reversed every round (latencies pooled over the rounds; "
            "images/s = all images / the rounds' summed "
            f"spans). Single request alone (median of {SERVICE_CALLS}, interleaved): "
            + ", ".join(f"{k} {v:.3f} s" for k, v in service.items())
            + f"; S = {s:.3f} s (the slowest), levels = "
            + ", ".join(f"{x:g}" for x in settings.arrivals_loads)
            + " x 1/S."
        )
        section.metrics["arrivals.service_s"] = s
        identical: list[float] = []
        turn = 0
        for index, load in enumerate(settings.arrivals_loads):
            level = LEVEL_NAMES[index] if index < len(LEVEL_NAMES) else f"l{index}"
            rate = load / s
            arrivals = [float(t) / rate for t in trace]
            runs: dict[str, list[Run]] = {STEP: [], REQUEST: [], DIFFUSERS: []}
            for r in range(rounds):
                order = (
                    [STEP, REQUEST, DIFFUSERS]
                    if turn % 2 == 0
                    else [DIFFUSERS, REQUEST, STEP]
                )
                turn += 1
                for name in order:
                    if name == DIFFUSERS:
                        runs[name].append(_run_sequential(one, arrivals))
                    else:
                        keep = set(alone) if name == STEP and r == 0 else set()
                        runs[name].append(
                            asyncio.run(
                                _run_engine(
                                    engines[name], recorders[name], case, arrivals, keep
                                )
                            )
                        )
            pooled = {name: Run.pool(values) for name, values in runs.items()}
            for name in (STEP, REQUEST, DIFFUSERS):
                _record(section, level, load, rate, name, pooled[name])
            identical += [
                psnr(alone[i], image)
                for i, image in sorted(runs[STEP][0].images.items())
            ]
            p95_step, p95_request = pooled[STEP].p95, pooled[REQUEST].p95
            section.metrics[f"arrivals.{level}.p95_ratio"] = (
                p95_step / p95_request if p95_request > 0 else None
            )
        if identical:
            same = sum(1 for x in identical if x == float("inf"))
            section.metrics["arrivals.step.identical_to_alone"] = same == len(identical)
            section.notes.append(
                f"batching=step: requests 0..{SERVICE_CALLS - 1} of "
                "every level's first round (they arrive first, so "
                "later arrivals join their batch) vs the same requests "
                f"alone: {same}/{len(identical)} bit-identical "
                "images"
                + (
                    ""
                    if same == len(identical)
                    else f", worst PSNR {min(identical):.1f} dB"
                )
                + "."
            )
        section.notes.append(
            "mean running while busy: the engine's running requests "
            "(``num_running``) sampled every 10 ms when > 0, "
            "the batch occupancy comparable across modes; requests "
            "per engine batch: the mean ``batch_size`` of the "
            "engine's BatchStats (stats listener), which with batching=step "
            "counts every request that joined the "
            "batch while it kept running, so it can exceed max_batch_size."
        )
    finally:
        for engine in engines.values():
            C.shutdown(engine)


def _record(
    section: Section, level: str, load: float, rate: float, name: str, run: Run
) -> None:
    lat = run.latencies
    mean_batch, running = run.mean_batch, run.mean_running
    section.add(
        f"{level} ({load:g}/S)",
        round(rate, 3),
        name,
        len(lat),
        round(run.p50, 3),
        round(run.p95, 3),
        round(max(lat), 3),
        round(run.images_per_s, 3),
        "" if mean_batch is None else round(mean_batch, 2),
        "" if running is None else round(running, 2),
    )
    key = f"arrivals.{level}.{_slug(name)}"
    section.metrics[f"arrivals.{level}.lambda"] = rate
    section.metrics[f"{key}.p50_s"] = run.p50
    section.metrics[f"{key}.p95_s"] = run.p95
    section.metrics[f"{key}.images_per_s"] = run.images_per_s
    if mean_batch is not None:
        section.metrics[f"{key}.mean_batch"] = mean_batch


def _slug(name: str) -> str:
    return {STEP: "step", REQUEST: "request", DIFFUSERS: "diffusers"}[name]


def _async_engine(path: Path, batching: str, max_batch: int, n: int) -> Any:
    from diffserve import AsyncEngine

    return AsyncEngine(
        str(path),
        env={},
        dtype=DTYPE,
        enforce_eager=True,
        max_batch_size=max_batch,
        batching=batching,
        max_queue=max(64, 2 * n),
        distributed_executor_backend="uni",
    )


def _alone(engine: Any, case: Case, seed: int) -> Any:
    """One request with nothing else in the engine; its image."""

    async def go() -> Any:
        from diffserve.types.request import RequestOutput

        async for event in engine.generate(C.request(case, seed=seed)):
            if isinstance(event, RequestOutput):
                return event.images[0]
        raise RuntimeError("the engine finished a request without an output")

    return asyncio.run(go())


def _diffusers_call(pipe: Any, case: Case) -> Callable[[int], Any]:
    """One diffusers image with ``seed`` (the same request as diffserve's: prompt, size,
    steps, text length)."""

    def call(seed: int) -> Any:
        return C.diffusers_image(pipe, case.size, case.steps, seed)

    return call


def _run_sequential(call: Callable[[int], Any], arrivals: list[float]) -> Run:
    """A single FIFO worker: request i starts at max(its arrival, the previous
    completion) and runs for a real call's time. Latency counts from the arrival, so
    waiting in the queue is part of it."""
    t0 = time.perf_counter()
    completions = []
    for i, at in enumerate(arrivals):
        wait = t0 + at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        call(SEED0 + i)
        completions.append(time.perf_counter() - t0)
    return Run(list(arrivals), completions)


class _Recorder:
    """The engine's executed batch sizes while a run is on (a stats listener cannot be
    removed, so it is registered once and switched on and off)."""

    def __init__(self, engine: Any) -> None:
        self.sizes: list[int] | None = None
        self._lock = threading.Lock()
        if hasattr(engine, "add_stats_listener"):
            engine.add_stats_listener(self._observe)

    def _observe(self, stats: Any) -> None:
        with self._lock:
            if self.sizes is not None and getattr(stats, "outcome", "ok") == "ok":
                self.sizes.append(int(stats.batch_size))

    def start(self) -> None:
        with self._lock:
            self.sizes = []

    def stop(self) -> list[int]:
        with self._lock:
            sizes, self.sizes = self.sizes or [], None
        return sizes


async def drive_open_loop(
    engine: Any,
    arrivals: Sequence[float],
    t0: float,
    one: Callable[[int], Coroutine[Any, Any, None]],
) -> list[int]:
    """Submit request i (``one(i)``, its own task) at ``t0 + arrivals[i]`` whatever the
    others are doing, and wait for all; returns the engine's running requests sampled
    every 10 ms while busy (the batch occupancy)."""
    loop = asyncio.get_running_loop()
    running: list[int] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            busy = getattr(engine, "num_running", 0)
            if busy:
                running.append(int(busy))
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    tasks = []
    try:
        for i, at in enumerate(arrivals):
            delay = t0 + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    finally:
        done.set()
        await sampler
    return running


async def _run_engine(
    engine: Any, recorder: _Recorder, case: Case, arrivals: list[float], keep: set[int]
) -> Run:
    """Open loop on an AsyncEngine: request i is submitted at t0 + arrivals[i] (its own
    task), whatever the others are doing. Completion = when its RequestOutput reaches
    this loop."""
    from diffserve.types.request import RequestOutput

    loop = asyncio.get_running_loop()
    completions: list[float | None] = [None] * len(arrivals)
    images: dict[int, Any] = {}
    t0 = loop.time()

    async def one(i: int) -> None:
        async for event in engine.generate(C.request(case, seed=SEED0 + i)):
            if isinstance(event, RequestOutput):
                completions[i] = loop.time() - t0
                if i in keep:
                    images[i] = event.images[0]

    recorder.start()
    try:
        running = await drive_open_loop(engine, arrivals, t0, one)
    finally:
        sizes = recorder.stop()
    missing = [i for i, c in enumerate(completions) if c is None]
    if missing:
        raise RuntimeError(f"requests {missing} finished without an output")
    return Run(
        list(arrivals),
        [float(c) for c in completions if c is not None],
        sizes,
        running,
        images,
    )
