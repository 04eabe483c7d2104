"""(d) Throughput in images/s with 1, 4 and 8 concurrent clients, batching off (max_batch_size 1)
and on, against sequential diffusers calls on the same case.

Clients are asyncio tasks on diffserve's AsyncEngine (in-process, uni executor); each sends its
share of the images one request at a time, with its own seeds. Wall time runs from the first
submission to the last image."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.section import Section, Unavailable
from benchmarks.settings import SEED, Case, Settings

DTYPE = "float32"


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.throughput_case
    path = models[case.model]
    total = settings.throughput_images
    mode = "eager" if settings.throughput_eager else "compile"
    section.notes.append(f"{case.label}, {DTYPE}, diffserve {mode}, {total} images per point.")
    section.columns = ["contender", "clients", "max_batch_size", "images", "wall s", "images/s",
                       "vs sequential diffusers"]
    base = _diffusers_sequential(path, case, total)
    section.add("diffusers sequential", 1, "", total, round(total / base, 2), round(base, 3), "1.00x")
    section.metrics["throughput.diffusers.images_per_s"] = base
    for batch in settings.batch_sizes:
        engine = _async_engine(path, batch, settings.throughput_eager)
        try:
            asyncio.run(_run_clients(engine, case, 1, 1, seed0=10_000))  # warm-up (and compile)
            for clients in settings.clients:
                wall, images = asyncio.run(_run_clients(engine, case, clients, max(total // clients, 1)))
                rate = images / wall
                section.add("diffserve AsyncEngine", clients, batch, images, round(wall, 2), round(rate, 3),
                            f"{rate / base:.2f}x")
                section.metrics[f"throughput.diffserve.c{clients}.b{batch}.images_per_s"] = rate
                section.metrics[f"throughput.diffserve.c{clients}.b{batch}.vs_diffusers"] = rate / base
        finally:
            C.shutdown(engine)
            gc.collect()


def _diffusers_sequential(path: Path, case: Case, total: int) -> float:
    pipe = C.load_diffusers(path, DTYPE)
    call = C.diffusers_call(pipe, case)
    call()  # warm-up
    t0 = time.perf_counter()
    for _ in range(total):
        call()
    rate = total / (time.perf_counter() - t0)
    del pipe, call
    gc.collect()
    return rate


def _async_engine(path: Path, batch: int, eager: bool) -> Any:
    try:
        from diffserve import AsyncEngine
    except (ImportError, AttributeError) as exc:
        raise Unavailable(f"diffserve.AsyncEngine: {exc}") from exc
    return AsyncEngine(str(path), dtype=DTYPE, enforce_eager=eager, max_batch_size=batch,
                       distributed_executor_backend="uni")


async def _run_clients(engine: Any, case: Case, clients: int, per_client: int, seed0: int = SEED) -> tuple[float, int]:
    """``clients`` tasks, each sending ``per_client`` requests back to back. Returns (wall s, images)."""
    from diffserve.engine.request import RequestOutput

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
