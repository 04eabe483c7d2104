"""The type checker guards the seams: ``make test`` runs mypy on the package
(pyproject's [tool.mypy]: check_untyped_defs), and these tests prove the checker catches
what it is there for: a pipeline that breaks the ``Pipeline`` protocol, and an object
passed where an engine client is expected."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    shutil.which("mypy") is None
    and not (Path(sys.executable).parent / "mypy").exists(),
    reason="mypy is installed by the test extra (make test)",
)

VIOLATIONS = """
from collections.abc import AsyncIterator, Sequence

from diffserve.engine.client import AsyncEngineClient
from diffserve.models.base import Pipeline
from diffserve.types.request import GenerationRequest, ProgressEvent, RequestOutput


class Broken(Pipeline):
    # Not a generator of step events:
    def run(self, batch: Sequence[GenerationRequest]) -> list[int]:
        return []


class NotAnEngine:
    def generate(
        self, request: GenerationRequest
    ) -> AsyncIterator[ProgressEvent | RequestOutput]:
        raise NotImplementedError


def serve(engine: AsyncEngineClient) -> None:
    del engine


serve(NotAnEngine())  # no abort, config, stats...: not an AsyncEngineClient
"""


def _mypy(*targets: str) -> subprocess.CompletedProcess[str]:
    mypy = Path(sys.executable).parent / "mypy"
    return subprocess.run(
        [
            str(mypy) if mypy.exists() else "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            *targets,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_protocol_violations_fail_the_type_check(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch_violations.py"
    scratch.write_text(VIOLATIONS, encoding="utf-8")
    proc = _mypy(str(scratch))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        'Signature of "run" incompatible '
        'with supertype "diffserve.models.base.Pipeline"' in proc.stdout
    )
    assert (
        'incompatible type "NotAnEngine"; expected "AsyncEngineClient"' in proc.stdout
    )


def test_the_pipelines_declare_the_protocol() -> None:
    # Nominal subclasses: mypy checks every member's signature against the protocol (the
    # package run).
    from diffserve.models.base import Pipeline
    from diffserve.models.flux.pipeline import FluxPipeline
    from diffserve.models.generic.pipeline import GenericPipeline

    assert Pipeline in FluxPipeline.__mro__ and Pipeline in GenericPipeline.__mro__
