"""One thread runs torch's parallel regions in a uni engine's process.

With GNU OpenMP (torch's CPU threads), once a second thread of a process has run a
parallel region the process holds more OpenMP threads than cores and libgomp stops
spinning between regions: every op of the worker then pays a wake-up (measured:
small-flux 256x256 bfloat16 0.48 s -> 0.35 s per image with the fix, SD3 on the generic
path 0.80 s -> 0.57 s). Each team leaves one pool thread per extra OpenMP thread, so a
second team shows as native threads that a process running the same requests on one
thread does not have.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import programs
import pytest

pytestmark = pytest.mark.e2e

TESTS = Path(__file__).resolve().parents[1]


def _native_threads(model: object, mode: str) -> int:
    # tests/openmp_threads.py, a fresh process: no OpenMP team before the requests.
    env = {
        **os.environ,
        "TOKENIZERS_PARALLELISM": "false",
        "DIFFSERVE_CPU_BF16": "0",
        "PYTHONPATH": programs.python_path_with(TESTS),
    }
    proc = programs.run("openmp_threads", model, mode, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "fixture", ["tiny_flux_dir", "tiny_sd3_dir"], ids=["native-flux", "generic-sd3"]
)
def test_a_uni_engine_runs_one_openmp_team(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    model = request.getfixturevalue(fixture)
    assert _native_threads(model, "engine") == _native_threads(model, "one-thread")
