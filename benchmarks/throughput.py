"""(d) Throughput in images/s with 1, 4 and 8 concurrent clients, batching off
(max_batch_size 1) and on, against sequential diffusers calls on the same case.

Clients are asyncio tasks on diffserve's AsyncEngine (in-process, uni executor); each
sends its share of the images one request at a time, with its own seeds. Every point
(and the diffusers baseline) is a call that makes the same number of images; points are
interleaved over rounds like every other contender, and images/s comes from the median
wall time."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, spread
from benchmarks.section import Section
from benchmarks.settings import SEED, Case, Settings

DTYPE = "float32"
BASELINE = "diffusers sequential"


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.throughput_case
    path = models[case.model]
    total = settings.throughput_images
    mode = "eager" if settings.throughput_eager else "compile"
    section.notes.append(
        f"{case.label}, {DTYPE}, diffserve {mode}, {total} images per point, "
        f"median of {settings.throughput_rounds} interleaved rounds."
    )
    section.columns = [
        "contender",
        "clients",
        "max_batch_size",
        "images",
        "median wall s",
        "spread ±",
        "images/s",
        "vs sequential diffusers",
    ]
    pipe = C.load_diffusers(path, DTYPE)
    one = C.diffusers_call(pipe, case)
    engines: dict[int, Any] = {}
    try:
        for batch in settings.batch_sizes:
            engines[batch] = _async_engine(path, batch, settings.throughput_eager)
            # Warm-up (and compile)
            asyncio.run(_run_clients(engines[batch], case, 1, 1, seed0=10_000))
        one()  # warm-up
        calls: dict[str, Callable[[], Any]] = {
            BASELINE: lambda: [one() for _ in range(total)]
        }
        points: dict[str, tuple[int, int]] = {}
        for batch, engine in engines.items():
            for clients in settings.clients:
                name = f"diffserve c{clients} b{batch}"
                points[name] = (clients, batch)
                calls[name] = _point(engine, case, clients, max(total // clients, 1))
        samples, _ = interleaved(calls, warmup=0, iters=settings.throughput_rounds)
        batch_hist = {
            b: Counter(e.stats().get("batch_sizes", [])) for b, e in engines.items()
        }
    finally:
        for engine in engines.values():
            C.shutdown(engine)
    base = total / median(samples[BASELINE])
    section.add(
        BASELINE,
        1,
        "",
        total,
        round(median(samples[BASELINE]), 2),
        f"{spread(samples[BASELINE]):.0%}",
        round(base, 3),
        "1.00x",
    )
    section.metrics["throughput.diffusers.images_per_s"] = base
    for name, (clients, batch) in points.items():
        images = clients * max(total // clients, 1)
        wall = median(samples[name])
        rate = images / wall
        section.add(
            "diffserve AsyncEngine",
            clients,
            batch,
            images,
            round(wall, 2),
            f"{spread(samples[name]):.0%}",
            round(rate, 3),
            f"{rate / base:.2f}x",
        )
        section.metrics[f"throughput.diffserve.c{clients}.b{batch}.images_per_s"] = rate
        section.metrics[f"throughput.diffserve.c{clients}.b{batch}.vs_diffusers"] = (
            rate / base
        )
    for batch, hist in batch_hist.items():
        # Whether batching actually formed batches: sizes the scheduler ran (warm-up
        # excluded).
        section.notes.append(
            f"max_batch_size {batch}: executed batch sizes {dict(sorted(hist.items()))}"
        )


def _point(engine: Any, case: Case, clients: int, per_client: int) -> Callable[[], int]:
    def call() -> int:
        return asyncio.run(_run_clients(engine, case, clients, per_client))[1]

    return call


def _async_engine(path: Path, batch: int, eager: bool) -> Any:
    from diffserve import AsyncEngine

    return AsyncEngine(
        str(path),
        dtype=DTYPE,
        enforce_eager=eager,
        max_batch_size=batch,
        distributed_executor_backend="uni",
    )


async def _run_clients(
    engine: Any, case: Case, clients: int, per_client: int, seed0: int = SEED
) -> tuple[float, int]:
    """``clients`` tasks, each sending ``per_client`` requests back to back. Returns
    (wall s, images)."""
    from diffserve.types.request import RequestOutput

    async def client(index: int) -> int:
        done = 0
        for j in range(per_client):
            req = C.request(case, seed=seed0 + index * per_client + j)
            async for event in engine.generate(req):
                if isinstance(event, RequestOutput):
                    done += len(event.images)
        return done

    t0 = time.perf_counter()
    counts = await asyncio.gather(*(client(i) for i in range(clients)))
    return time.perf_counter() - t0, sum(counts)
