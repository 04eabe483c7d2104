"""(f) Data-parallel replicas and the Ray executor.

Throughput: 8 concurrent ``AsyncEngine`` clients on the mp executor, 2 replicas whose
workers run 1 torch thread each against 1 replica whose worker runs 2 threads, against
sequential diffusers calls (2 threads). Worker threads are set through
``OMP_NUM_THREADS`` in the environment the spawned workers inherit. Overhead: one
request on the ray executor against uni in-process, interleaved.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, spread
from benchmarks.section import Section
from benchmarks.settings import Settings
from benchmarks.throughput import _run_clients

DTYPE = "float32"
CLIENTS = 8
BASELINE = "diffusers sequential (2 threads)"


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.throughput_case
    path = models[case.model]
    total = CLIENTS
    section.notes.append(
        f"{case.label}, {DTYPE}, eager, {CLIENTS} concurrent "
        "clients x 1 image per point, "
        f"median of {settings.throughput_rounds} interleaved rounds."
    )
    section.columns = [
        "contender",
        "median wall s",
        "spread ±",
        "images/s",
        "vs sequential diffusers",
    ]
    pipe = C.load_diffusers(path, DTYPE)
    one = C.diffusers_call(pipe, case)
    engines: dict[str, Any] = {}
    try:
        with _worker_threads(1):
            engines["2 replicas x 1 thread (mp)"] = _async_engine(path, replicas=2)
        # The harness needs one mp engine; the comparison is a full run's.
        if not settings.smoke:
            with _worker_threads(2):
                engines["1 replica x 2 threads (mp)"] = _async_engine(path, replicas=1)
        for engine in engines.values():
            asyncio.run(_run_clients(engine, case, 2, 1, seed0=10_000))  # warm-up
        one()
        calls: dict[str, Callable[[], Any]] = {
            BASELINE: lambda: [one() for _ in range(total)]
        }
        for name, engine in engines.items():
            calls[name] = lambda engine=engine: asyncio.run(
                _run_clients(engine, case, CLIENTS, 1)
            )
        samples, _ = interleaved(calls, warmup=0, iters=settings.throughput_rounds)
        replicas_used = _replicas_seen(engines["2 replicas x 1 thread (mp)"], case)
    finally:
        for engine in engines.values():
            C.shutdown(engine)
    base = total / median(samples[BASELINE])
    for name, times in samples.items():
        rate = total / median(times)
        section.add(
            name,
            round(median(times), 2),
            f"{spread(times):.0%}",
            round(rate, 3),
            f"{rate / base:.2f}x",
        )
        key = "diffusers" if name == BASELINE else name.split(" (")[0].replace(" ", "_")
        section.metrics[f"replicas.{key}.images_per_s"] = rate
    section.notes.append(
        "2-replica engine: replicas that served the last round's "
        f"requests: {replicas_used}"
    )
    _ray_overhead(section, settings, models)


def _ray_overhead(
    section: Section, settings: Settings, models: dict[str, Path]
) -> None:
    if importlib.util.find_spec("ray") is None:
        section.notes.append("ray overhead: not available (ray is not installed)")
        return
    # a Ray cluster costs the suite ~10 CPU-s; the ray executor has its own tests
    # (tests/e2e)
    if settings.smoke:
        section.notes.append("ray overhead: measured in full runs only")
        return
    case = settings.overhead_case
    path = models[case.model]
    engines: list[Any] = []
    try:
        uni = C.load_engine(path, DTYPE)
        engines.append(uni)
        ray = C.load_engine(path, DTYPE, distributed_executor_backend="ray")
        engines.append(ray)
        calls = {
            "uni in-process": C.engine_call(uni, case),
            "ray": C.engine_call(ray, case),
        }
        samples, _ = interleaved(
            calls,
            warmup=settings.warmup,
            iters=settings.iters,
            budget_s=settings.case_budget_s,
        )
    finally:
        for engine in engines:
            C.shutdown(engine)
    extra = median(samples["ray"]) / median(samples["uni in-process"]) - 1.0
    section.metrics["replicas.ray.extra"] = extra
    section.notes.append(
        f"one request ({case.label}): ray {median(samples['ray']):.3f} s vs uni "
        f"{median(samples['uni in-process']):.3f} s per image ({extra:+.1%}; spreads "
        f"{spread(samples['ray']):.0%} / {spread(samples['uni in-process']):.0%})"
    )


@contextlib.contextmanager
def _worker_threads(threads: int) -> Iterator[None]:
    """Spawned mp workers read OMP_NUM_THREADS at import: set it only while they
    start."""
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def _async_engine(path: Path, replicas: int) -> Any:
    from diffserve import AsyncEngine

    return AsyncEngine(
        str(path),
        dtype=DTYPE,
        enforce_eager=True,
        max_batch_size=1,
        num_replicas=replicas,
        distributed_executor_backend="mp",
    )


def _replicas_seen(engine: Any, case: Any) -> list[int]:
    from diffserve.types.request import RequestOutput

    async def run() -> list[int]:
        async def one(seed: int) -> int:
            async for event in engine.generate(C.request(case, seed=seed)):
                if isinstance(event, RequestOutput):
                    return int(event.attestation.get("replica", -1))
            return -1

        return sorted(
            set(await asyncio.gather(*(one(20_000 + i) for i in range(CLIENTS))))
        )

    return asyncio.run(run())
