"""(k) Per-request LoRA: the cost of one adapter against the base model per image (one
engine, requests interleaved), and images/s with 8 concurrent clients using 4 different
adapters (two clients each) against 8 clients on the base model, on one AsyncEngine with
request batching (max_batch_size 4: requests batch only with the same adapters).
Adapters: random rank-16 LoRAs (``make-model tiny-flux-lora``) on the attention
projections and MLP outputs of every block."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, spread
from benchmarks.section import Section
from benchmarks.settings import SEED, Case, Settings

DTYPE = "float32"
ADAPTERS = 4
RANK = 16


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    from diffserve import AsyncEngine, Engine
    from diffserve.zoo.lora import build_flux_lora

    case = settings.lora_case
    path = models[case.model]
    root = path.parent / f"{case.model}-loras"
    files = {
        f"style{i}": build_flux_lora(
            path, root / f"style{i}", seed=i, rank=RANK, force=True
        )
        for i in range(ADAPTERS)
    }
    modules = ",".join(f"{name}={file}" for name, file in files.items())
    section.columns = [
        "measurement",
        "contender",
        "median s",
        "spread ±",
        "runs",
        "images/s",
        "ratio vs base (per image: s; throughput: images/s)",
    ]
    section.notes.append(
        f"{case.label}, {DTYPE}, eager, uni; {ADAPTERS} adapters "
        f"of rank {RANK}, max_loras {ADAPTERS}."
    )

    engine = Engine(
        str(path),
        dtype=DTYPE,
        enforce_eager=True,
        lora_modules=modules,
        max_loras=ADAPTERS,
    )
    try:
        calls = {
            "base": C.engine_call(engine, case),
            "one adapter": C.engine_call(engine, case, loras=(("style0", 1.0),)),
        }
        for call in calls.values():
            call()  # warm-up
        samples, _ = interleaved(
            calls, warmup=0, iters=settings.iters, budget_s=settings.case_budget_s
        )
    finally:
        C.shutdown(engine)
    base = median(samples["base"])
    for name, times in samples.items():
        section.add(
            "per image",
            name,
            round(median(times), 4),
            f"{spread(times):.0%}",
            len(times),
            round(1 / median(times), 3),
            round(median(times) / base, 3),
        )
    section.metrics["lora.one.overhead"] = median(samples["one adapter"]) / base - 1

    engine = AsyncEngine(
        str(path),
        dtype=DTYPE,
        enforce_eager=True,
        lora_modules=modules,
        max_loras=ADAPTERS,
        max_batch_size=4,
        distributed_executor_backend="uni",
    )
    try:
        asyncio.run(_clients(engine, case, list(files)[:1], 1))  # warm-up
        points = {
            "8 clients, base": lambda: asyncio.run(
                _clients(engine, case, [None], settings.lora_images)
            ),
            f"8 clients, {ADAPTERS} adapters": lambda: asyncio.run(
                _clients(engine, case, list(files), settings.lora_images)
            ),
        }
        samples, _ = interleaved(points, warmup=0, iters=settings.throughput_rounds)
    finally:
        C.shutdown(engine)
    base_rate = settings.lora_images / median(samples["8 clients, base"])
    for name, times in samples.items():
        rate = settings.lora_images / median(times)
        section.add(
            "throughput",
            name,
            round(median(times), 3),
            f"{spread(times):.0%}",
            len(times),
            round(rate, 3),
            round(rate / base_rate, 3),
        )
        section.metrics[
            f"lora.throughput.{'base' if 'base' in name else 'adapters'}.images_per_s"
        ] = rate
    section.metrics["lora.throughput.ratio"] = (
        section.metrics["lora.throughput.adapters.images_per_s"]
        / section.metrics["lora.throughput.base.images_per_s"]
    )


async def _clients(
    engine: Any, case: Case, adapters: list[str | None], images: int
) -> int:
    """8 clients sharing ``images`` requests; client i uses ``adapters[i %
    len(adapters)]`` (None: base)."""
    from diffserve.types.request import RequestOutput

    per_client = max(images // 8, 1)

    async def client(index: int) -> int:
        name = adapters[index % len(adapters)]
        done = 0
        for j in range(per_client):
            req = C.request(
                case,
                seed=SEED + index * per_client + j,
                loras=((name, 1.0),) if name else (),
            )
            async for event in engine.generate(req):
                if isinstance(event, RequestOutput):
                    done += len(event.images)
        return done

    start = time.perf_counter()
    counts = await asyncio.gather(*(client(i) for i in range(8)))
    assert sum(counts) == 8 * per_client, (counts, time.perf_counter() - start)
    return sum(counts)
