"""CI runs the benchmark's smoke mode (tiny model, a couple of iterations) so it cannot rot.

No timing assertions: the numbers of a smoke run on a shared CI machine mean nothing. The test
checks that one documented command produces RESULTS.md and its JSON twin with every section
measured and every target listed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION_KEYS = ("e2e", "step", "overhead", "throughput", "cold", "replicas", "parallel", "cache")


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_smoke_benchmark_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=570)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    data = json.loads((tmp_path / "results.json").read_text())
    assert data["mode"] == "smoke"
    assert data["machine"]["cores"] >= 1 and data["machine"]["torch"]
    sections = {s["key"]: s for s in data["sections"]}
    assert set(sections) == set(SECTION_KEYS)
    for key, section in sections.items():
        assert section["status"] == "ok", f"{key}: {section['status']}: {section['reason']} {section['notes']}"
        assert section["rows"], key
    assert len(data["targets"]) == 14

    text = out.read_text()
    for heading in ("## Targets", "## Machine", "## Models", *(f"## {s['title']}" for s in data["sections"])):
        assert heading in text, heading
    for target in data["targets"]:
        assert target["name"] in text
