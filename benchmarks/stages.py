"""(n) Stages at runtime: 8 concurrent clients on the three-stage topology
(``encode_denoise_decode``, every stage on the mp executor) against the single-stage
engine (mp), images/s and each stage's busy fraction (the sum of its batch times over
the wall time: how much the stages overlap); then the conditioning cache's saving at a
repeated-prompt mix (8 clients drawing from 2 prompts: cache on against
``conditioning_cache: false`` on the same engine, interleaved). Smoke mode runs the
stages on uni (the harness only)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, spread
from benchmarks.section import Section
from benchmarks.settings import Case, Settings

DTYPE = "float32"
CLIENTS = 8
PROMPTS = ("a red fox in the snow, watercolor", "a lighthouse at dusk, oil painting")


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    from diffserve import AsyncEngine

    case = settings.stages_case
    path = models[case.model]
    executor = "uni" if settings.smoke else "mp"
    section.columns = [
        "measurement",
        "contender",
        "median wall s",
        "spread ±",
        "images/s",
        "ratio",
        "busy: encode / denoise / decode",
    ]
    section.notes.append(
        f"{case.label}, {DTYPE}, eager, {executor} executors, "
        f"{CLIENTS} concurrent clients x "
        f"{settings.stages_images // CLIENTS} images, median "
        f"of {settings.throughput_rounds} "
        "interleaved rounds."
    )
    engines = {
        "single stage": AsyncEngine(
            str(path),
            dtype=DTYPE,
            enforce_eager=True,
            distributed_executor_backend=executor,
            env={},
        ),
        "encode_denoise_decode": AsyncEngine(
            str(path),
            dtype=DTYPE,
            enforce_eager=True,
            env={},
            deploy_config={
                "topology": "encode_denoise_decode",
                "distributed_executor_backend": executor,
            },
        ),
    }
    try:
        busy: dict[str, list[float]] = {}
        for engine in engines.values():
            asyncio.run(_clients(engine, case, 2, 2, unique=True))  # warm-up
        calls = {
            name: (
                lambda engine=engine, name=name: _timed(
                    engine, case, settings.stages_images, busy, name
                )
            )
            for name, engine in engines.items()
        }
        samples, _ = interleaved(calls, warmup=0, iters=settings.throughput_rounds)
        base = settings.stages_images / median(samples["single stage"])
        for name, times in samples.items():
            rate = settings.stages_images / median(times)
            fractions = (
                " / ".join(f"{f:.0%}" for f in busy.get(name, [])) or "one stage"
            )
            section.add(
                "throughput",
                name,
                round(median(times), 3),
                f"{spread(times):.0%}",
                round(rate, 3),
                round(rate / base, 3),
                fractions,
            )
            section.metrics[f"stages.{name.replace(' ', '_')}.images_per_s"] = rate
        section.metrics["stages.ratio"] = (
            section.metrics["stages.encode_denoise_decode.images_per_s"] / base
        )
        staged = engines["encode_denoise_decode"]
        mix = {
            "repeated prompts, cache on": lambda: asyncio.run(
                _clients(staged, case, CLIENTS, 1, unique=False)
            ),
            "repeated prompts, cache off": lambda: asyncio.run(
                _clients(staged, case, CLIENTS, 1, unique=False, cached=False)
            ),
        }
        samples, _ = interleaved(mix, warmup=0, iters=settings.throughput_rounds)
        off = CLIENTS / median(samples["repeated prompts, cache off"])
        for name, times in samples.items():
            rate = CLIENTS / median(times)
            section.add(
                "conditioning cache",
                name,
                round(median(times), 3),
                f"{spread(times):.0%}",
                round(rate, 3),
                round(rate / off, 3),
                "",
            )
        section.metrics["stages.cache.ratio"] = (
            CLIENTS / median(samples["repeated prompts, cache on"])
        ) / off
    finally:
        for engine in engines.values():
            C.shutdown(engine)


def _timed(
    engine: Any, case: Case, images: int, busy: dict[str, list[float]], name: str
) -> float:
    start = time.perf_counter()
    outputs = asyncio.run(
        _clients(engine, case, CLIENTS, max(images // CLIENTS, 1), unique=True)
    )
    wall = time.perf_counter() - start
    stages = [o.attestation.get("stages") for o in outputs]
    if all(stages):
        per_stage: dict[int, float] = {}
        for entries in stages:
            for entry in entries:  # type: ignore[union-attr]
                per_stage[entry["stage_id"]] = (
                    per_stage.get(entry["stage_id"], 0.0) + entry["batch_ms"] / 1000.0
                )
        busy[name] = [per_stage[i] / wall for i in sorted(per_stage)]
    return wall


async def _clients(
    engine: Any,
    case: Case,
    clients: int,
    per_client: int,
    *,
    unique: bool,
    cached: bool = True,
) -> list[Any]:
    """``clients`` tasks of ``per_client`` requests; unique prompts, or two prompts
    repeated."""
    from diffserve.types.request import RequestOutput

    stamp = time.perf_counter_ns()

    async def client(index: int) -> list[Any]:
        outs = []
        for j in range(per_client):
            prompt = (
                f"{PROMPTS[0]} #{stamp}-{index}-{j}"
                if unique
                else PROMPTS[(index + j) % len(PROMPTS)]
            )
            request = replace(
                C.request(
                    case,
                    seed=10_000 + index * per_client + j,
                    conditioning_cache=cached,
                ),
                prompt=prompt,
            )
            async for event in engine.generate(request):
                if isinstance(event, RequestOutput):
                    outs.append(event)
        return outs

    results = await asyncio.gather(*(client(i) for i in range(clients)))
    return [o for outs in results for o in outs]
