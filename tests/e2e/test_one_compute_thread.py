"""One thread runs torch's parallel regions in a uni engine's process.

With GNU OpenMP (torch's CPU threads), once a second thread of a process has run a parallel region the
process holds more OpenMP threads than cores and libgomp stops spinning between regions: every op of the
worker then pays a wake-up (measured: small-flux 256x256 bfloat16 0.48 s -> 0.35 s per image with the fix,
SD3 on the generic path 0.80 s -> 0.57 s). Each team leaves one pool thread per extra OpenMP thread, so a
second team shows as native threads that a process running the same requests on one thread does not have.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = r"""
import json, os, sys, threading
from diffserve import Engine, GenerationRequest
from diffserve.registry.models import MODEL_FAMILIES, read_class_name
from diffserve.types.results import to_pil

def native_threads():
    python = {t.native_id for t in threading.enumerate()}
    return sum(1 for tid in os.listdir("/proc/self/task") if int(tid) not in python)

model, mode = sys.argv[1], sys.argv[2]
# 256x256: the images are above torch's parallel grain, so a copy of them would be a parallel region.
requests = [GenerationRequest(prompt="a fox", height=256, width=256, num_inference_steps=1, seed=1,
                              max_sequence_length=16, output_type=kind) for kind in ("pil", "pt")]
if mode == "engine":
    with Engine(model, dtype="float32", env={}) as engine:
        for request in requests:
            engine.generate(request)
        count = native_threads()
else:  # the same requests, every torch op on this one thread
    family = MODEL_FAMILIES[read_class_name(model)]
    cls = family.load_pipeline_class(family.implementation)
    from diffserve.config.resolve import resolve
    stage = resolve(model=model, overrides={"dtype": "float32"}, env={}).stage_for_role("diffusion")
    pipe = cls.from_stage(model, stage)
    for request in requests:
        images = pipe(request.with_seed()).images
        if request.output_type == "pil":
            to_pil(images)
    count = native_threads()
print(json.dumps(count))
"""


def _native_threads(model: object, mode: str) -> int:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "DIFFSERVE_CPU_BF16": "0", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(model), mode], capture_output=True, text=True,
                          env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("fixture", ["tiny_flux_dir", "tiny_sd3_dir"], ids=["native-flux", "generic-sd3"])
def test_a_uni_engine_runs_one_openmp_team(request: pytest.FixtureRequest, fixture: str) -> None:
    model = request.getfixturevalue(fixture)
    assert _native_threads(model, "engine") == _native_threads(model, "one-thread")
