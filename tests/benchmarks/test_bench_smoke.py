"""CI runs the benchmark's smoke mode (tiny model, a couple of iterations) so it cannot
rot.

No timing assertions: the numbers of a smoke run on a shared CI machine mean nothing.
The test checks that one documented command produces RESULTS.md and its JSON twin with
every section measured and every target listed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import programs
import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION_KEYS = (
    "e2e",
    "step",
    "overhead",
    "throughput",
    "cold",
    "replicas",
    "parallel",
    "cache",
    "arrivals",
    "generic",
    "lora",
    "cache_trained",
    "quant",
    "stages",
    "video",
    "tracing",
    "cache_video",
    "ar_stage",
    "mixed",
    "qwen21",
)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_smoke_benchmark_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # `python -m benchmarks.run --smoke`, as a user runs it; every contender it starts
    # is a process of its own.
    proc = programs.run(
        "benchmarks.run", "--smoke", "--out", out, env=env, cwd=ROOT, timeout=570
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    data = json.loads((tmp_path / "results.json").read_text())
    assert data["mode"] == "smoke"
    assert data["machine"]["cores"] >= 1 and data["machine"]["torch"]
    sections = {s["key"]: s for s in data["sections"]}
    assert set(sections) == set(SECTION_KEYS)
    for key, section in sections.items():
        assert section["status"] == "ok", (
            f"{key}: {section['status']}: {section['reason']} {section['notes']}"
        )
        assert section["rows"], key
    # 23 fixed targets (the default-dtype row, section o's two and section s's two
    # included) + one generic-path parity row per smoke case and dtype.
    assert len(data["targets"]) == 24
    _check_mixed(sections["mixed"])
    assert any(
        t["name"].startswith(
            "small-flux 256x256/4 eager in the machine's default dtype"
        )
        for t in data["targets"]
    )

    text = out.read_text()
    for heading in (
        "## Targets",
        "## Machine",
        "## Models",
        *(f"## {s['title']}" for s in data["sections"]),
    ):
        assert heading in text, heading
    for target in data["targets"]:
        assert target["name"] in text


def _check_mixed(section: dict) -> None:
    """Section s at toy scale: every contender of the open loop and of the closed loop
    has a row with sane values (the figures themselves mean nothing in smoke mode)."""
    col = {name: i for i, name in enumerate(section["columns"])}
    rows = {
        (r[col["run"]].split(",")[0], r[col["contender"]]): r for r in section["rows"]
    }
    assert {c for run, c in rows if run == "open loop"} == {
        "diffserve batching=step",
        "diffserve batching=request",
        "diffusers sequential",
    }, rows
    closed = {c for run, c in rows if run == "closed loop"}
    assert "diffusers sequential" in closed and any(
        c.startswith("diffserve batching=step") for c in closed
    ), rows
    for row in rows.values():
        assert row[col["requests"]] > 0 and row[col["images/s"]] > 0, row
        assert row[col["p95 s"]] >= row[col["p50 s"]] > 0, row
    metrics = section["metrics"]
    assert (
        metrics["mixed.open.p95_ratio"] > 0 and metrics["mixed.closed.vs_diffusers"] > 0
    )


def test_arrivals_trace_statistics_and_fifo_worker() -> None:
    """Section i's pieces that need no model: the seeded Poisson trace, the percentiles
    and images/s, and the sequential baseline's FIFO (a request starts at max(its
    arrival, the previous completion))."""
    import time

    import numpy as np

    from benchmarks import arrivals

    trace = arrivals.unit_trace(2000, seed=7)
    assert trace[0] == 0.0 and np.all(np.diff(trace) > 0)
    # Same seed, same trace for everyone.
    assert np.array_equal(trace, arrivals.unit_trace(2000, seed=7))
    assert 0.9 < trace[-1] / 1999 < 1.1  # unit rate: mean gap ~1
    assert len(arrivals.unit_trace(1)) == 1

    run = arrivals.Run(
        arrivals=[0.0, 1.0, 2.0, 3.0],
        completions=[1.0, 3.0, 3.5, 7.0],
        batch_sizes=[1, 2, 1],
    )
    assert run.latencies == [1.0, 2.0, 1.5, 4.0]
    assert run.p50 == 1.75 and abs(run.p95 - 3.7) < 1e-9  # numpy's linear interpolation
    assert (
        run.images_per_s == 4 / 7.0
        and run.mean_batch == 4 / 3
        and run.mean_running is None
    )

    pooled = arrivals.Run.pool([run, arrivals.Run([0.0, 0.5], [2.0, 2.5], running=[2])])
    # Latencies kept, runs laid end to end.
    assert pooled.latencies == [*run.latencies, 2.0, 2.0]
    assert (
        pooled.images_per_s == 6 / (7.0 + 2.5)
        and pooled.batch_sizes == [1, 2, 1]
        and pooled.running == [2]
    )

    starts: list[float] = []
    t0 = time.perf_counter()

    def call(seed: int) -> None:
        starts.append(time.perf_counter() - t0)
        time.sleep(0.05)

    fifo = arrivals._run_sequential(call, [0.0, 0.01, 0.2])
    assert starts[1] >= 0.05 - 1e-3  # arrived while the first ran: waits for it
    # Idle worker waits for the arrival.
    assert starts[2] >= 0.2 - 1e-3 and fifo.completions[2] >= 0.25 - 1e-3
    assert all(lat >= 0.05 - 1e-3 for lat in fifo.latencies)
