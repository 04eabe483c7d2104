"""``benchmarks/gpu_blocks.py`` (the GPU block benchmark of ``make gpu-check``) kept
working on a CPU: its ``--smoke`` run builds the same blocks at toy widths through the
same code (kernel set, fused single block, quantization hook, timing, profiler, report)
and writes where it is told, never over the GPU report."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_blocks


def test_smoke_run_measures_every_contender_and_writes_its_report(tmp_path) -> None:
    out = tmp_path / "blocks.md"
    assert gpu_blocks.main(["--smoke", "--out", str(out), "--iters", "2"]) == 0
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert [r["contender"] for r in rows] == [
        c.name for c in gpu_blocks.contenders(smoke=True)
    ]
    assert all(r["status"] == "ok" for r in rows), rows
    for row in rows:
        assert row["double_ms"] > 0 and row["single_ms"] > 0
        expected = 28 * (19 * row["double_ms"] + 38 * row["single_ms"]) / 1e3
        assert row["projected_image_s"] == pytest.approx(expected)
    assert rows[2]["attention"] == {"double_block": "math", "single_block": "math"}
    report = out.read_text()
    assert "CPU (smoke" in report and "fastest:" in report and "addmm" in report


def test_smoke_never_writes_the_gpu_report() -> None:
    with pytest.raises(SystemExit):
        gpu_blocks.main(["--smoke"])
