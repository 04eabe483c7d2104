"""Make the repository's ``benchmarks`` package importable from these tests (it is not
installed with diffserve). A regular package on sys.path wins over the
``tests/benchmarks`` namespace directory."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
