"""How ``make test`` splits the suite over pytest-xdist workers (tests/conftest.py's scheduler): the units
one worker takes whole, and which go first. A plain module so tests can check the naming rule it relies on."""

from __future__ import annotations

import re
from pathlib import Path

RAY_GROUP = "ray"
# The longest units go first, so no worker is left with one of them at the end (measured serially on 2
# cores: the benchmark smoke ~110 s, the Ray tests ~110 s together, the toy-shapes quality checks ~25-50 s).
LONG_FIRST = ("tests/benchmarks/test_bench_smoke.py", RAY_GROUP, "tests/zoo/test_toy_shapes.py",
              "tests/models/test_step_cache_quality.py", "tests/zoo/test_toy_shapes_lora.py")
# A test of a Ray-using module runs on Ray when its name or parameter id says so: test_ray_..., ..._ray_...,
# [ray], [flux-ray]. The module's other tests stay a unit of their own.
RAY_TEST = re.compile(r"(^|[_\[-])ray([_\]-]|$)")
TESTS = Path(__file__).resolve().parent


def _modules_using_ray() -> frozenset[str]:
    """Test modules that ask for the session's Ray (``ray_session``)."""
    return frozenset(str(path.relative_to(TESTS.parent)) for path in TESTS.rglob("test_*.py")
                     if "ray_session" in path.read_text())


RAY_MODULES = _modules_using_ray()


def unit(nodeid: str) -> str:
    """The unit of work one xdist worker takes whole: the Ray tests of every module (one Ray), or the
    rest of a module (its module-scoped servers and engines start once)."""
    module, _, test = nodeid.partition("::")
    return RAY_GROUP if module in RAY_MODULES and RAY_TEST.search(test) else module
