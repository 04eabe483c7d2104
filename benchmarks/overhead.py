"""(c) What the serving layers cost per image: the mp executor (worker process, IPC) vs
uni (worker inline), and HTTP through the OpenAI SDK against ``diffserve serve`` vs
in-process uni. All three run the same request (max_sequence_length 512, the HTTP API's
fixed length), interleaved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import contenders as C
from benchmarks.common import interleaved, median, psnr, spread
from benchmarks.http_client import HTTP_MAX_SEQUENCE_LENGTH, sync_call
from benchmarks.section import Section
from benchmarks.server import Server
from benchmarks.settings import Settings

DTYPE = "float32"


def measure(section: Section, settings: Settings, models: dict[str, Path]) -> None:
    case = settings.overhead_case
    path = models[case.model]
    section.notes.append(
        f"{case.label}, {DTYPE}, eager, max_sequence_length {HTTP_MAX_SEQUENCE_LENGTH}."
    )
    section.columns = [
        "contender",
        "median s/image",
        "spread ±",
        "runs",
        "overhead vs uni in-process",
        "PSNR vs uni",
    ]
    engines: list[Any] = []
    try:
        uni = C.load_engine(path, DTYPE)
        engines.append(uni)
        calls = {
            "uni in-process": C.engine_call(
                uni, case, max_sequence_length=HTTP_MAX_SEQUENCE_LENGTH
            )
        }
        mp = C.load_engine(path, DTYPE, distributed_executor_backend="mp")
        engines.append(mp)
        calls["mp in-process"] = C.engine_call(
            mp, case, max_sequence_length=HTTP_MAX_SEQUENCE_LENGTH
        )
        flags = [
            "--dtype",
            DTYPE,
            "--enforce-eager",
            "--distributed-executor-backend",
            "uni",
        ]
        with Server(path, flags) as srv:
            calls["HTTP (OpenAI SDK) uni"] = sync_call(srv.base_url, path.name, case)
            samples, last = interleaved(
                calls,
                warmup=settings.warmup,
                iters=settings.iters,
                budget_s=settings.case_budget_s,
            )
    finally:
        for engine in engines:
            C.shutdown(engine)
    base = median(samples["uni in-process"])
    for name, times in samples.items():
        m = median(times)
        extra = m / base - 1.0
        section.add(
            name,
            round(m, 4),
            f"{spread(times):.0%}",
            len(times),
            f"{extra:+.1%}",
            ""
            if name.startswith("uni")
            else _db(psnr(last[name][0], last["uni in-process"][0])),
        )
        section.metrics[f"overhead.{name.split()[0].lower()}.median_s"] = m
        if not name.startswith("uni"):
            section.metrics[f"overhead.{name.split()[0].lower()}.extra"] = extra
        phases = ", ".join(
            f"{k} {v:.0f}" for k, v in getattr(calls[name], "timings", {}).items()
        )
        if phases:
            # Worker-side phases: if mp's are slower than uni's, the cost is compute in
            # the worker, not IPC.
            section.notes.append(
                f"{name}: last call's phases as the worker measured them (ms): {phases}"
            )


def _db(value: float) -> Any:
    return "identical" if value == float("inf") else round(value, 1)
