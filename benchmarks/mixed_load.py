"""Section s's traffic and its drivers: the seeded mix of requests (size, steps,
step-cache threshold, adapter), the diffserve request and the diffusers call for one of
them, and the three ways a contender is driven: open loop on an AsyncEngine (request i
submitted at its arrival time, whatever the others are doing), a FIFO worker over
sequential diffusers calls (request i starts at max(its arrival, the previous
completion)), and closed loop (``clients`` clients, each with one request outstanding).

Every driver returns a ``MixedRun`` (an ``arrivals.Run``): per request its submission
and completion (s from the start), so latencies and images/s are computed one way for
all of them."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import contenders as C
from benchmarks.arrivals import Run, drive_open_loop, percentile
from benchmarks.settings import SEED, Case

SEED0 = SEED + 2000  # request i of a mix has seed SEED0 + i
ADAPTERS = ("A", "B")


@dataclass(frozen=True)
class Mixed:
    """One request of the mix: square size, denoise steps, step-cache threshold (0:
    uncached) and adapter (None: the base model)."""

    size: int
    steps: int
    threshold: float
    adapter: str | None

    @property
    def label(self) -> str:
        return f"{self.size}/{self.steps}/{self.threshold:g}/{self.adapter or '-'}"


def draw_mix(
    n: int,
    sizes: Sequence[int],
    steps: Sequence[int],
    thresholds: Sequence[float],
    adapters: Sequence[str | None] = (None, *ADAPTERS),
    seed: int = SEED,
) -> list[Mixed]:
    """``n`` requests, each field drawn uniformly and independently (seeded)."""
    rng = np.random.default_rng(seed)
    return [
        Mixed(
            int(sizes[int(rng.integers(len(sizes)))]),
            int(steps[int(rng.integers(len(steps)))]),
            float(thresholds[int(rng.integers(len(thresholds)))]),
            adapters[int(rng.integers(len(adapters)))],
        )
        for _ in range(n)
    ]


def warmup_mix(
    sizes: Sequence[int], steps: Sequence[int], threshold: float
) -> list[Mixed]:
    """Every size once, and each adapter and the step cache once (first calls of a
    shape or an adapter pay allocations and primitive creation)."""
    small = min(steps)
    items = [Mixed(size, small, 0.0, None) for size in sizes]
    items += [Mixed(min(sizes), small, threshold, name) for name in ADAPTERS]
    return items


def engine_request(model: str, item: Mixed, seed: int) -> Any:
    """The diffserve request for ``item`` (prompt, guidance and text length as every
    section's)."""
    return C.request(
        Case(model, item.size, item.steps),
        seed=seed,
        cache_threshold=item.threshold,
        loras=((item.adapter, 1.0),) if item.adapter else (),
    )


class DiffusersMixed:
    """Plain ``FluxPipeline`` calls for mix items: adapters through diffusers' own
    ``load_lora_weights`` (PEFT) and ``set_adapters``/``disable_lora``, switched only
    when the next request's adapter differs; no step cache (plain diffusers has none on
    by default: every step is computed whatever the request's threshold)."""

    def __init__(self, pipe: Any, adapters: dict[str, Path]) -> None:
        self.pipe = pipe
        self.adapters_error = ""
        for name, file in adapters.items():
            try:
                pipe.load_lora_weights(str(file.parent), adapter_name=name)
            except (ImportError, ValueError) as exc:  # peft missing: base model only
                self.adapters_error = f"{type(exc).__name__}: {exc}"
                break
        self.with_adapters = bool(adapters) and not self.adapters_error
        self._active: str | None = "unset"

    def _select(self, adapter: str | None) -> None:
        if not self.with_adapters or adapter == self._active:
            return
        if adapter is None:
            self.pipe.disable_lora()
        else:
            self.pipe.enable_lora()
            self.pipe.set_adapters([adapter], [1.0])
        self._active = adapter

    def __call__(self, item: Mixed, seed: int) -> Any:
        self._select(item.adapter)
        return C.diffusers_image(self.pipe, item.size, item.steps, seed)


Call = Callable[[Mixed, int], Any]


@dataclass
class MixedRun(Run):
    """A run, with the steps the step cache skipped per request (completion order)."""

    skipped: list[int] = field(default_factory=list)


def pool(runs: Sequence[MixedRun]) -> MixedRun:
    """``Run.pool`` (runs laid end to end), the skipped steps of every run kept."""
    base = Run.pool(list(runs))
    return MixedRun(
        base.arrivals,
        base.completions,
        running=base.running,
        skipped=[s for run in runs for s in run.skipped],
    )


def alone_times(call: Call, mix: Sequence[Mixed]) -> list[float]:
    """Seconds of each request of ``mix`` called alone, one after another."""
    times = []
    for i, item in enumerate(mix):
        t0 = time.perf_counter()
        call(item, SEED0 + i)
        times.append(time.perf_counter() - t0)
    return times


def run_sequential(
    call: Call, mix: Sequence[Mixed], arrivals: Sequence[float]
) -> MixedRun:
    """One FIFO worker: request i starts at max(its arrival, the previous completion);
    latency counts from the arrival, so waiting in the queue is part of it."""
    t0 = time.perf_counter()
    completions = []
    for i, (item, at) in enumerate(zip(mix, arrivals, strict=True)):
        wait = t0 + at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        call(item, SEED0 + i)
        completions.append(time.perf_counter() - t0)
    return MixedRun(list(arrivals), completions)


def closed_sequential(call: Call, mix: Sequence[Mixed], clients: int) -> MixedRun:
    """``clients`` clients with one request outstanding each, served by one FIFO
    worker: requests 0..clients-1 are queued at 0, and client c sends its next request
    when its previous one completes, so the worker serves them in index order and
    request i is submitted when request i - clients completed."""
    t0 = time.perf_counter()
    completions: list[float] = []
    for i, item in enumerate(mix):
        call(item, SEED0 + i)
        completions.append(time.perf_counter() - t0)
    submitted = [
        completions[i - clients] if i >= clients else 0.0 for i in range(len(mix))
    ]
    return MixedRun(submitted, completions)


async def _one(engine: Any, request: Any) -> Any:
    from diffserve.types.request import RequestOutput

    async for event in engine.generate(request):
        if isinstance(event, RequestOutput):
            return event
    raise RuntimeError("the engine finished a request without an output")


def engine_call(engine: Any, model: str) -> Call:
    """One request alone on an AsyncEngine (nothing else in it)."""
    return lambda item, seed: asyncio.run(
        _one(engine, engine_request(model, item, seed))
    )


async def run_open(
    engine: Any, model: str, mix: Sequence[Mixed], arrivals: Sequence[float]
) -> MixedRun:
    """Open loop: request i is submitted at t0 + arrivals[i] (its own task). The
    engine's running requests are sampled every 10 ms while busy (the batch
    occupancy)."""
    loop = asyncio.get_running_loop()
    completions: list[float | None] = [None] * len(mix)
    skipped: list[int] = []
    t0 = loop.time()

    async def one(i: int) -> None:
        out = await _one(engine, engine_request(model, mix[i], SEED0 + i))
        completions[i] = loop.time() - t0
        skipped.append(skipped_steps(out))

    running = await drive_open_loop(engine, arrivals, t0, one)
    return _finished(arrivals, completions, running, skipped)


async def run_closed(
    engine: Any, model: str, mix: Sequence[Mixed], clients: int
) -> MixedRun:
    """Closed loop: client c sends requests c, c + clients, ... one at a time."""
    loop = asyncio.get_running_loop()
    submitted: list[float] = [0.0] * len(mix)
    completions: list[float | None] = [None] * len(mix)
    skipped: list[int] = []
    t0 = loop.time()

    async def client(c: int) -> None:
        for i in range(c, len(mix), clients):
            submitted[i] = loop.time() - t0
            out = await _one(engine, engine_request(model, mix[i], SEED0 + i))
            completions[i] = loop.time() - t0
            skipped.append(skipped_steps(out))

    await asyncio.gather(*(client(c) for c in range(clients)))
    return _finished(submitted, completions, [], skipped)


def _finished(
    arrivals: Sequence[float],
    completions: list[float | None],
    running: list[int],
    skipped: list[int],
) -> MixedRun:
    missing = [i for i, c in enumerate(completions) if c is None]
    if missing:
        raise RuntimeError(f"requests {missing} finished without an output")
    return MixedRun(
        list(arrivals),
        [float(c) for c in completions if c is not None],
        running=running,
        skipped=skipped,
    )


def skipped_steps(output: Any) -> int:
    """Steps the step cache skipped for one output (0 when uncached or unreported)."""
    entries = (getattr(output, "attestation", None) or {}).get("cache")
    entry = entries[0] if isinstance(entries, list) and entries else entries
    if not isinstance(entry, dict):
        return 0
    trace = entry.get("trace") or []
    return sum(1 for _, *rest in trace if rest and rest[-1] == "skip")


class FailedBatches(logging.Handler):
    """Counts the engine's "batch of N failed (...); retrying its requests one by one"
    warnings while installed on the ``diffserve`` logger: a figure measured through
    that fallback must say so."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first = ""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("batch of") and "one by one" in message:
            self.count += 1
            self.first = self.first or message

    def __enter__(self) -> FailedBatches:
        logging.getLogger("diffserve").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("diffserve").removeHandler(self)


def mix_summary(mix: Sequence[Mixed]) -> str:
    """How many requests of each size, step count, threshold and adapter."""

    def share(values: list[str]) -> str:
        keys, counts = np.unique(np.asarray(values), return_counts=True)
        return "/".join(f"{k}:{c}" for k, c in zip(keys, counts, strict=True))

    return (
        f"sizes {share([str(m.size) for m in mix])}, steps "
        f"{share([str(m.steps) for m in mix])}, thresholds "
        f"{share([f'{m.threshold:g}' for m in mix])}, adapters "
        f"{share([m.adapter or 'none' for m in mix])}"
    )


def by_size(run: Run, mix: Sequence[Mixed]) -> str:
    """p50/p95 latency per size of a run (pooled runs: request j is mix[j % n])."""
    lat = run.latencies
    parts = []
    for size in sorted({m.size for m in mix}):
        values = [x for j, x in enumerate(lat) if mix[j % len(mix)].size == size]
        parts.append(
            f"{size} {percentile(values, 50):.2f}/{percentile(values, 95):.2f} s"
        )
    return ", ".join(parts)


def budget_line(engine: Any) -> str:
    """The step-level scheduler's resolved token budget and joins, where reported."""
    try:
        schedule = getattr(engine.load(), "schedule", None)
    except Exception:  # noqa: BLE001 - a report line, never a failure
        schedule = None
    tokens = getattr(schedule, "max_step_tokens", None)
    joins = getattr(schedule, "joins", None)
    if not tokens and joins is None:
        return ""
    return (
        f"Step-level scheduler: max_step_tokens {tokens} (resolved), "
        f"{joins} requests joined running batches since start."
    )


def loadavg() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # pragma: no cover - not on Linux
        return "n/a"


def histogram(hist: dict[int, int]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in hist.items()) + "}"
