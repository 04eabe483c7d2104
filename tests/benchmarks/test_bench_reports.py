"""Each CPU kind keeps its own benchmark report (benchmarks/run.py:default_report), and
an emulated kind's timings (DIFFSERVE_CPU_KIND) are never filed as that kind's."""

from __future__ import annotations

import pytest

from benchmarks.common import kind_name, machine
from benchmarks.run import default_report, refuse_other_kind
from diffserve.config.platform import CpuKind, cpu_kind


def test_every_kind_writes_its_own_report_and_an_emulated_one_its_own_too() -> None:
    assert (
        default_report("AVX2").name == "RESULTS.md"
        and default_report("AMX").name == "RESULTS-AMX.md"
    )
    assert kind_name(CpuKind("AVX2", emulated_on="AMX")) == "AVX2-ON-AMX"
    assert (
        default_report(kind_name(CpuKind("AVX2", emulated_on="AMX"))).name
        == "RESULTS-AVX2-ON-AMX.md"
    )
    assert machine()["cpu_capability"] == kind_name(cpu_kind())


def test_a_report_of_another_kind_is_never_overwritten(tmp_path) -> None:
    out = tmp_path / "RESULTS.md"
    (tmp_path / "results.json").write_text('{"machine": {"cpu_capability": "AVX2"}}')
    refuse_other_kind(out, {"cpu_capability": "AVX2"})
    with pytest.raises(SystemExit, match="holds figures of a AVX2 machine"):
        refuse_other_kind(out, {"cpu_capability": "AVX2-ON-AMX"})
