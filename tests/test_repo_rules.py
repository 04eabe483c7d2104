"""Project-wide rules that every change must keep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "diffserve"
MAX_LINES = 400


def test_no_module_exceeds_line_budget() -> None:
    too_long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, (
        f"files over {MAX_LINES} lines (split them by concept): {too_long}"
    )


def test_import_is_cheap_and_side_effect_free() -> None:
    code = (
        "import sys, logging, diffserve, diffserve.errors, diffserve.logging;"
        "heavy = [m for m in ('torch', 'transformers', 'diffusers', "
        "'fastapi') if m in sys.modules];"
        "assert not heavy, heavy;"
        "assert not logging.getLogger('diffserve').handlers"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_print_outside_cli() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "entrypoints" in path.parts:
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("print("):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{lineno}")
    assert not offenders, offenders


def test_the_suite_keeps_its_caches_to_itself() -> None:
    """Compile caches live in the run's own directory (tests/conftest.py), on every
    xdist worker too."""
    import os
    from pathlib import Path

    from diffserve.worker.compile_cache import cache_root

    root = Path(os.environ["DIFFSERVE_TEST_CACHE_ROOT"])
    assert root.is_dir() and root.name.startswith("diffserve-test-cache-")
    assert cache_root().is_relative_to(root)
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).is_relative_to(root)


def test_tests_taking_the_session_cluster_are_named_for_it() -> None:
    """xdist hands the Ray tests to one worker by name (tests/xdist_units.py): a test
    that takes the ``ray_session`` fixture but is not named for Ray would start a second
    Ray on another worker."""
    import ast

    from xdist_units import RAY_TEST

    tests = Path(__file__).resolve().parent
    unnamed = [
        f"{path.relative_to(tests)}::{node.name}"
        for path in tests.rglob("test_*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test_")
        and "ray_session" in {arg.arg for arg in node.args.args}
        and not RAY_TEST.search(node.name)
    ]
    assert not unnamed, (
        f"name these test_ray_... (or parametrize them [ray]): {unnamed}"
    )


def test_a_native_family_pipeline_is_hooks_only() -> None:
    """A native family's ``pipeline.py`` holds its hooks of the shared runner
    (``models/runner``), not a serving loop of its own: under 200 lines each."""
    pipelines = {
        str(p.relative_to(PACKAGE.parent)): len(
            p.read_text(encoding="utf-8").splitlines()
        )
        for p in (PACKAGE / "models").glob("*/pipeline.py")
        if p.parent.name != "generic"  # diffusers' own pipeline class, driven
    }
    assert {
        "diffserve/models/flux/pipeline.py",
        "diffserve/models/wan/pipeline.py",
    } <= set(pipelines)
    assert {path: n for path, n in pipelines.items() if n >= 200} == {}
